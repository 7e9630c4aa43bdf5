// Browser tests: playwright-core driving Debian's chromium against a real `tessera dev`
// (scripts/test-web.sh sets TESSERA_BIN, CHROMIUM and builds web/dist first).
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['tests/browser/**/*.test.ts'],
    environment: 'node',
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 420_000,
    reporters: ['verbose'],
  },
});
