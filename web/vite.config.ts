// Builds the console into dist/ (served by the control plane at `/`). `npm run dev` serves it
// with hot reload and forwards API calls to a control plane at $TESSERA_URL (default
// http://127.0.0.1:8080, where `tessera dev` listens).
import { defineConfig } from 'vite';

const target = process.env.TESSERA_URL ?? 'http://127.0.0.1:8080';

export default defineConfig({
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: { outDir: 'dist', emptyOutDir: true, sourcemap: true, chunkSizeWarningLimit: 300 },
  server: { proxy: { '/v1': target, '/.well-known': target, '/healthz': target } },
});
