// Unit tests: formatting and data shaping, no browser.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  test: { include: ['src/**/*.test.ts'], environment: 'node' },
});
