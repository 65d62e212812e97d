// Times sandbox creates and kills through the official E2B SDK (bench/e2b_bench.cc runs it
// against a private tryboxd). Usage: node bench.mjs N. Prints {"create_ms": [...],
// "kill_ms": [...]}.
import { Sandbox } from 'e2b'

const n = Number(process.argv[2] || 5)
const template = process.env.TRYBOX_TEST_TEMPLATE || 'debian-12'
const out = { create_ms: [], kill_ms: [] }
for (let i = 0; i < n; i++) {
  let t = performance.now()
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
  out.create_ms.push(performance.now() - t)
  t = performance.now()
  if (!(await Sandbox.kill(sbx.sandboxId))) throw new Error('kill said there was no sandbox')
  out.kill_ms.push(performance.now() - t)
}
console.log(JSON.stringify(out))
