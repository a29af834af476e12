// Runs a wasm32-wasi program under node's built-in WASI:
//   node --single-threaded-gc --experimental-wasi-unstable-preview1 --no-warnings \
//     wasi-run.mjs prog.wasm [args...]
// The CMAKE_CROSSCOMPILING_EMULATOR of toolchains/wasm32-wasi.cmake (ctest and
// gtest_discover_tests run every test program through it). The program gets
// its arguments, this process's environment (QKV_BACKEND, GTEST_*) and the
// file system as a native test would (/ preopened: the heatmap example
// writes its pictures); its exit code becomes node's.
import { readFile } from 'node:fs/promises';
import process from 'node:process';
import { WASI } from 'node:wasi';

const [program, ...args] = process.argv.slice(2);
if (!program) {
  console.error('usage: wasi-run.mjs program.wasm [args...]');
  process.exit(2);
}
const wasi = new WASI({
  version: 'preview1',
  args: [program, ...args],
  env: process.env,
  preopens: { '/': '/' },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(program));
const imports = wasi.getImportObject
  ? wasi.getImportObject()
  : { wasi_snapshot_preview1: wasi.wasiImport };
const instance = await WebAssembly.instantiate(module, imports);
process.exitCode = wasi.start(instance) ?? 0;
