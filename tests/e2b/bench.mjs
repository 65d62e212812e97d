// Timings through the official E2B SDK for bench/e2b_bench.cc, against a private tryboxd.
//   node bench.mjs create N            N creates and kills: {"create_ms": [...], "kill_ms": [...]}
//   node bench.mjs exec ID N MIB       in sandbox ID: N commands.run('true'), then a MIB MiB
//                                      file written and read back:
//                                      {"run_ms": [...], "write_ms", "read_ms", "bytes"}
import { Sandbox } from 'e2b'

const [mode, ...args] = process.argv.slice(2)
const template = process.env.TRYBOX_TEST_TEMPLATE || 'debian-12'
const out = {}
if (mode === 'create') {
  const n = Number(args[0] || 5)
  out.create_ms = []
  out.kill_ms = []
  for (let i = 0; i < n; i++) {
    let t = performance.now()
    const sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
    out.create_ms.push(performance.now() - t)
    t = performance.now()
    if (!(await Sandbox.kill(sbx.sandboxId))) throw new Error('kill said there was no sandbox')
    out.kill_ms.push(performance.now() - t)
  }
} else if (mode === 'exec') {
  const [id, n, mib] = [args[0], Number(args[1] || 10), Number(args[2] || 8)]
  const sbx = await Sandbox.connect(id, { timeoutMs: 600_000 })
  out.run_ms = []
  for (let i = 0; i < n; i++) {
    const t = performance.now()
    const r = await sbx.commands.run('true')
    out.run_ms.push(performance.now() - t)
    if (r.exitCode !== 0) throw new Error('true failed')
  }
  const data = new Uint8Array(mib << 20)
  for (let i = 0; i < data.length; i++) data[i] = (i * 7919) & 255
  let t = performance.now()
  await sbx.files.write('/tmp/bench.bin', data)
  out.write_ms = performance.now() - t
  t = performance.now()
  const back = await sbx.files.read('/tmp/bench.bin', { format: 'bytes' })
  out.read_ms = performance.now() - t
  if (back.length !== data.length) throw new Error(`read ${back.length} bytes of ${data.length}`)
  for (let i = 0; i < data.length; i += 4099) {
    if (back[i] !== data[i]) throw new Error(`byte ${i} differs`)
  }
  out.bytes = data.length
} else {
  console.error('usage: node bench.mjs create N | exec ID N MIB')
  process.exit(2)
}
console.log(JSON.stringify(out))
