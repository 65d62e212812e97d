// Drives tryboxd's E2B-compatible control plane with the official, unmodified E2B SDK
// (tests/e2e/e2b_e2e_test.cc runs it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set
// to a private daemon). Prints one JSON object of what it saw; exits non-zero on anything
// the SDK did not expect.
import { Sandbox, CommandExitError } from 'e2b'

const template = process.env.TRYBOX_TEST_TEMPLATE || 'debian-12'
const run = process.env.TRYBOX_TEST_RUN || String(Date.now())
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const out = {}
const err = async (f) => {
  try {
    return { value: await f() }
  } catch (e) {
    return { error: `${e.name}: ${e.message}` }
  }
}

let t = Date.now()
const sbx = await Sandbox.create(template, {
  metadata: { suite: 'e2b', run, 'with space': 'a b&c=d%' },
  envs: { GREETING: 'hi' },
  timeoutMs: 600_000,
})
out.create_ms = Date.now() - t
out.first = sbx.sandboxId

const info = await sbx.getInfo()
out.info = {
  sandboxId: info.sandboxId,
  templateId: info.templateId,
  metadata: info.metadata,
  state: info.state,
  startedAt: info.startedAt.toISOString(),
  endAt: info.endAt.toISOString(),
  cpuCount: info.cpuCount,
  memoryMB: info.memoryMB,
}

const second = await Sandbox.create(template, { metadata: { suite: 'e2b', run }, timeoutMs: 600_000 })
out.second = second.sandboxId

// The list, one per page, filtered by metadata.
const pager = Sandbox.list({ query: { metadata: { run } }, limit: 1 })
out.listed = []
out.pages = 0
while (pager.hasNext && out.pages < 10) {
  for (const s of await pager.nextItems()) out.listed.push(s.sandboxId)
  out.pages++
}
out.filtered_none = (await Sandbox.list({ query: { metadata: { run: run + '-other' } } }).nextItems()).length
out.filtered_odd = (
  await Sandbox.list({ query: { metadata: { 'with space': 'a b&c=d%' } } }).nextItems()
).map((s) => s.sandboxId)

out.killed = await Sandbox.kill(second.sandboxId)
out.killed_again = await Sandbox.kill(second.sandboxId)

const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000 })
out.connected = again.sandboxId

// Commands (envd's process service): output through callbacks as it is printed, an exit
// code, the sandbox's envVars, the default user and root, a background command killed.
const cmd = {}
const lines = []
let r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.4; done; echo oops >&2', {
  onStdout: (d) => lines.push([Date.now(), d]),
  onStderr: (d) => lines.push([Date.now(), 'ERR:' + d]),
})
cmd.streamed = lines.map(([, d]) => d)
cmd.stream_gaps_ms = lines.slice(1).map(([t], i) => t - lines[i][0])
cmd.stdout = r.stdout
cmd.stderr = r.stderr
cmd.exit = r.exitCode
// Live output, deterministically: the command waits for a file that is made only once its
// first line has reached the callback; were output held until the end, it would give up
// after 60 s and never print go-seen.
let sawReady
const ready = new Promise((resolve) => (sawReady = resolve))
const live = await sbx.commands.run(
  'echo ready; for i in $(seq 600); do [ -e /tmp/go ] && break; sleep 0.1; done; [ -e /tmp/go ] && echo go-seen',
  { background: true, onStdout: (d) => d.includes('ready') && sawReady() }
)
await Promise.race([ready, new Promise((r) => setTimeout(r, 90_000).unref())])
await sbx.commands.run('touch /tmp/go')
cmd.live = (await live.wait()).stdout
try {
  await sbx.commands.run('echo partial; exit 3')
  cmd.failing = 'no error'
} catch (e) {
  cmd.failing = e instanceof CommandExitError ? { exitCode: e.exitCode, stdout: e.stdout } : String(e)
}
cmd.env = (await sbx.commands.run('echo "$GREETING"')).stdout
cmd.whoami = (await sbx.commands.run('whoami; pwd')).stdout
cmd.root = (await sbx.commands.run('whoami', { user: 'root' })).stdout
const bg = await sbx.commands.run('sleep 600', { background: true })
cmd.bg_pid = bg.pid
cmd.listed = (await sbx.commands.list()).map((p) => ({ pid: p.pid, cmd: p.cmd, args: p.args }))
cmd.bg_killed = await bg.kill()
try {
  await bg.wait()
  cmd.bg_wait = 'no error'
} catch (e) {
  cmd.bg_wait = e instanceof CommandExitError ? { exitCode: e.exitCode, error: e.error } : String(e)
}
cmd.bg_killed_again = await sbx.commands.kill(bg.pid)
try {
  await sbx.commands.run('sleep 30', { timeoutMs: 1500 })
  cmd.timeout = 'no error'
} catch (e) {
  cmd.timeout = `${e.name}: ${e.message}`
}
// Input: a command started with stdin open reads what is sent, in order, to the EOF that
// closing it gives; one started without (the default) refuses input by name.
const upper = await sbx.commands.run('tr a-z A-Z; echo "[eof]"', { background: true, stdin: true })
await upper.sendStdin('first line\n')
await sbx.commands.sendStdin(upper.pid, new TextEncoder().encode('second\n'))
await upper.closeStdin()
cmd.stdin = (await upper.wait()).stdout
cmd.stdin_after_end = await err(() => sbx.commands.sendStdin(upper.pid, 'late'))
const noInput = await sbx.commands.run('sleep 600', { background: true })
cmd.stdin_refused = await err(() => noInput.sendStdin('x'))
cmd.close_refused = await err(() => noInput.closeStdin())
cmd.resize_refused = await err(() => sbx.pty.resize(noInput.pid, { cols: 90, rows: 20 }))
await noInput.kill()
out.commands = cmd

// A PTY: bash on a terminal of the given size, typed into, resized, interrupted, exited.
const pty = {}
let screen = ''
const decoder = new TextDecoder()
const term = await sbx.pty.create({
  cols: 80,
  rows: 24,
  timeoutMs: 300_000,
  onData: (d) => (screen += decoder.decode(d, { stream: true })),
})
const type = (text) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(text))
const seen = async (text) => {
  for (const t0 = Date.now(); Date.now() - t0 < 60_000; await sleep(100)) {
    if (screen.includes(text)) return true
  }
  return false
}
await type('stty size; tty; echo "who=$(whoami)"; echo "sum=$((6*7))"\n')
pty.typed = await seen('sum=42')
pty.size = /\b24 80\b/.test(screen)
pty.tty = /\/dev\/pts\/\d+/.test(screen)
pty.user = screen.includes('who=user')
await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
await type('echo "size=$(stty size)"\n')
pty.resized = await seen('size=30 100')
// Ctrl-C reaches the foreground job through the terminal's line discipline.
await type('sleep 300\n')
for (const t0 = Date.now(); Date.now() - t0 < 60_000; await sleep(200)) {
  if ((await sbx.commands.run('pgrep -x sleep || true')).stdout.trim()) break
}
await type('\x03')
await type('echo "after=$((1+1))"\n')
pty.interrupted = await seen('after=2')
pty.close_refused = await err(() => sbx.commands.closeStdin(term.pid))
pty.stdin_refused = await err(() => sbx.commands.sendStdin(term.pid, 'x'))
await type('exit 5\n')
try {
  await term.wait()
  pty.exit = 'no error'
} catch (e) {
  pty.exit = e instanceof CommandExitError ? e.exitCode : String(e)
}
out.pty = pty

// Files (envd's filesystem service and GET /files), as the default account.
const fs = {}
await sbx.commands.run(
  'mkdir -p proj/sub && printf hello > proj/a.txt && ln -s a.txt proj/link && printf \'<b>x</b>\' > "proj/we ird.txt"'
)
fs.made = await sbx.files.makeDir('proj/new')
fs.made_again = await sbx.files.makeDir('proj/new')
fs.list = (await sbx.files.list('proj')).map((e) => ({ name: e.name, type: e.type, size: e.size, path: e.path }))
fs.deep = (await sbx.files.list('proj', { depth: 2 })).length
const finfo = await sbx.files.getInfo('proj/a.txt')
fs.info = { name: finfo.name, type: finfo.type, size: finfo.size, owner: finfo.owner, path: finfo.path, permissions: finfo.permissions }
fs.read = await sbx.files.read('proj/a.txt')
fs.read_missing = await err(() => sbx.files.read('proj/none.txt'))
fs.read_root_only = await err(() => sbx.files.read('/root/.bashrc'))
fs.list_file = await err(() => sbx.files.list('proj/a.txt'))
fs.renamed = (await sbx.files.rename('proj/a.txt', 'proj/b.txt')).path
fs.read_renamed = await sbx.files.read('proj/b.txt')
await sbx.files.remove('proj/sub')
fs.exists_removed = await sbx.files.exists('proj/sub')
fs.exists_kept = await sbx.files.exists('proj/b.txt')
const w = await sbx.files.write('proj/deep/w.txt', 'written\n')
fs.write = { name: w.name, path: w.path, type: w.type }
fs.read_written = await sbx.files.read('proj/deep/w.txt')
fs.written_owner = (await sbx.commands.run('stat -c %U proj/deep/w.txt proj/deep')).stdout
const many = await sbx.files.write([
  { path: '/home/user/m1.txt', data: 'one' },
  { path: 'm2.bin', data: new Uint8Array([0, 1, 2, 255]) },
])
fs.write_many = many.map((e) => e.path)
fs.read_m2 = Array.from(await sbx.files.read('m2.bin', { format: 'bytes' }))
// Past the 1 MiB limit of other requests: uploads have their own (64 MiB).
const big = new Uint8Array(3 << 20)
for (let i = 0; i < big.length; i++) big[i] = (i * 31 + (i >> 13)) & 255
await sbx.files.write('big.bin', big)
const bigBack = await sbx.files.read('big.bin', { format: 'bytes' })
fs.big_ok = bigBack.length === big.length && bigBack.every((b, i) => b === big[i])
fs.write_root_only = await err(() => sbx.files.write('/root/nope.txt', 'x'))
fs.write_as_root = (await sbx.files.write('/root/yes.txt', 'x', { user: 'root' })).path
fs.tmp_left = (await sbx.commands.run('ls -a /tmp | grep -c trybox-upload || true', { user: 'root' })).stdout
// Watching a directory: events as files change under it (recursive), then stopped.
const watched = []
await sbx.commands.run('mkdir -p watched/sub')
const watcher = await sbx.files.watchDir('watched', (e) => watched.push(`${e.type}:${e.name}`), {
  recursive: true,
  timeoutMs: 300_000,
})
await sbx.commands.run(
  'echo a > watched/a.txt; echo b > watched/sub/b.txt; mv watched/a.txt watched/c.txt; rm watched/sub/b.txt; chmod 600 watched/c.txt'
)
for (const t0 = Date.now(); Date.now() - t0 < 60_000 && !watched.includes('chmod:c.txt'); ) {
  await sleep(100)
}
await watcher.stop()
fs.watch = watched
fs.watch_missing = await err(() => sbx.files.watchDir('nope', () => {}))
fs.watch_root_only = await err(() => sbx.files.watchDir('/root', () => {}))
out.files = fs

// A short timeout, then the sandbox goes by itself.
await sbx.setTimeout(2000)
t = Date.now()
out.expired = false
while (Date.now() - t < 120_000) {
  try {
    await Sandbox.getInfo(sbx.sandboxId)
  } catch (e) {
    out.expired_error = `${e.name}: ${e.message}`
    out.expired = true
    break
  }
  await sleep(250)
}
out.expire_ms = Date.now() - t

try {
  await Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(40) }).nextItems()
  out.wrong_key = 'accepted'
} catch (e) {
  out.wrong_key = `${e.name}: ${e.message}`
}
try {
  await Sandbox.create('no-such-image', { timeoutMs: 10_000 })
  out.unknown_template = 'created'
} catch (e) {
  out.unknown_template = `${e.name}: ${e.message}`
}

console.log(JSON.stringify(out))
