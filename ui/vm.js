// One VM (#/vm/ID): its state, its commands with their output as they run, its files,
// and its egress audit. Destroy asks first, in <dialog id="confirm-destroy">.

import {el, table, syncChildren, setText, api, act, enc, argvText, execEnding, humanBytes, humanMs, humanDuration, shortTime, timeText, nowSeconds} from './lib.js';
import {OutputView, followExec} from './output.js';

// Output is loaded by itself for this many of the newest execs; older ones on request,
// so a VM with hundreds of commands does not open hundreds of streams.
const AUTO_OUTPUT = 10;

// --- Destroy ---

function confirmDestroy(id) {
  const dialog = document.getElementById('confirm-destroy');
  setText(dialog.querySelector('.vm-id'), id);
  return new Promise((resolve) => {
    const confirm = dialog.querySelector('.confirm');
    const cancel = dialog.querySelector('.cancel');
    const finish = (yes) => {
      confirm.removeEventListener('click', onConfirm);
      cancel.removeEventListener('click', onCancel);
      dialog.removeEventListener('cancel', onCancel);
      dialog.close();
      resolve(yes);
    };
    const onConfirm = () => finish(true);
    const onCancel = (e) => {
      e.preventDefault();
      finish(false);
    };
    confirm.addEventListener('click', onConfirm);
    cancel.addEventListener('click', onCancel);
    dialog.addEventListener('cancel', onCancel); // Escape
    dialog.showModal();
    cancel.focus(); // the safe choice is the default one
  });
}

// --- Execs ---

class ExecItem {
  constructor(scope, x) {
    this.scope = scope;
    this.id = x.id;
    this.view = new OutputView();
    this.stream = null;
    this.complete = false; // both streams read to their end: never opened again
    this.state = el('span', {class: 'exec-state'});
    this.meta = el('span', {class: 'exec-meta'});
    this.more = el('div', {class: 'exec-more'});
    this.node = el(
      'article',
      {class: 'exec', 'data-exec': x.id},
      el('h3', {}, el('span', {class: 'exec-id'}, `#${x.id}`), ' ', el('code', {class: 'argv'}, `$ ${argvText(x.argv)}`)),
      el('p', {class: 'exec-line'}, this.state, ' ', this.meta),
      this.more,
      this.view.pre,
    );
  }

  update(x, auto) {
    const running = x.state === 'running';
    setText(this.state, execEnding(x));
    this.state.className = `exec-state ${running ? 'running' : x.outcome === 'exited' && x.exit_code === 0 ? 'ok' : 'bad'}`;
    const took = running ? humanDuration(nowSeconds() - x.started_at) : humanMs(x.duration_ms);
    setText(this.meta, `started ${shortTime(x.started_at)} · ${took} · ${humanBytes(x.stdout_bytes)} out, ${humanBytes(x.stderr_bytes)} err`);
    if (this.stream || this.complete) return;
    if (auto || running) {
      this.follow(x);
    } else if (!this.more.firstChild) {
      const button = el('button', {type: 'button', class: 'load-output'}, 'Show output');
      button.addEventListener('click', () => {
        button.remove();
        this.follow(x);
      });
      this.more.append(button);
    }
  }

  follow(x) {
    this.more.replaceChildren();
    const running = x.state === 'running';
    this.stream = followExec(this.scope, x.id, this.view, {
      stdoutBytes: x.stdout_bytes,
      stderrBytes: x.stderr_bytes,
      running,
      first: running,
    });
    // Ended or failed, it is not opened again: a failure's note stays in the output.
    this.stream.done.then(() => {
      this.stream = null;
      this.complete = true;
    });
  }
}

function renderExecs(scope, section) {
  const list = el('div', {class: 'exec-list'});
  const empty = el('p', {class: 'empty'}, 'No commands yet.');
  section.append(el('h2', {}, 'Commands'), empty, list);
  const items = new Map();
  return (execs) => {
    empty.hidden = execs.length > 0;
    // Newest first; ps lists them oldest first.
    const newest = [...execs].reverse();
    newest.forEach((x, i) => {
      let item = items.get(x.id);
      if (!item) {
        item = new ExecItem(scope, x);
        items.set(x.id, item);
      }
      item.update(x, i < AUTO_OUTPUT);
    });
    syncChildren(list, newest, {key: (x) => x.id, make: (x) => items.get(x.id).node});
  };
}

// --- Files ---

function parentOf(path) {
  const trimmed = path.replace(/\/+$/, '');
  const i = trimmed.lastIndexOf('/');
  return i <= 0 ? '/' : trimmed.slice(0, i);
}

function renderFiles(vm, section) {
  const input = el('input', {id: 'files-path', type: 'text', value: '/root', autocomplete: 'off', spellcheck: 'false'});
  const go = el('button', {id: 'files-go', type: 'submit'}, 'Go');
  const form = el('form', {class: 'files-form'}, el('label', {for: 'files-path'}, 'Path'), input, go);
  const files = table('files-list', ['Name', 'Size', 'Mode', 'Owner', 'Modified']);
  // Listed when asked, not on opening the page: each listing (and each download) is an exec
  // of the guest's own tools, recorded among the VM's commands like any other.
  const shown = el('p', {class: 'files-shown'}, 'Go lists the directory (it runs find in the guest, shown among the commands).');
  section.append(el('h2', {}, 'Files'), form, shown, files.wrap);

  const load = (path) =>
    act(go, async () => {
      const r = await api(`/trybox/v1/vms/${enc(vm)}/files?path=${enc(path)}`);
      const here = r.path ?? path;
      input.value = here;
      setText(shown, `${here}: ${r.entries.length} entries`);
      const rows = [];
      if (here !== '/') {
        const up = el('button', {type: 'button', class: 'dir'}, '..');
        up.addEventListener('click', () => load(parentOf(here)));
        rows.push(el('tr', {'data-path': parentOf(here), class: 'up'}, el('td', {colspan: '5'}, up)));
      }
      const entries = [...r.entries].sort((a, b) => (b.type === 'FILE_TYPE_DIRECTORY') - (a.type === 'FILE_TYPE_DIRECTORY') || a.name.localeCompare(b.name));
      for (const f of entries) {
        let name;
        if (f.type === 'FILE_TYPE_DIRECTORY') {
          name = el('button', {type: 'button', class: 'dir'}, `${f.name}/`);
          name.addEventListener('click', () => load(f.path));
        } else {
          name = el('a', {class: 'download', href: `/trybox/v1/vms/${enc(vm)}/files/content?path=${enc(f.path)}`, download: f.name}, f.name);
        }
        rows.push(
          el(
            'tr',
            {'data-path': f.path},
            el('td', {}, name, f.symlinkTarget ? el('span', {class: 'link-target'}, ` → ${f.symlinkTarget}`) : null),
            el('td', {class: 'num'}, f.type === 'FILE_TYPE_DIRECTORY' ? '' : humanBytes(f.size)),
            el('td', {}, f.permissions ?? ''),
            el('td', {}, [f.owner, f.group].filter(Boolean).join(':')),
            el('td', {}, f.modifiedTime ? new Date(f.modifiedTime).toLocaleString() : ''),
          ),
        );
      }
      files.body.replaceChildren(...rows);
    });

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    load(input.value.trim() || '/');
  });
  return load;
}

// --- Egress ---

export function isAllowed(verdict) {
  return String(verdict ?? '').startsWith('allow');
}

// A row's class: refused and failed connections in red; a policy change is no refusal.
export function verdictClass(verdict) {
  if (isAllowed(verdict)) return 'allowed';
  if (verdict === 'policy') return 'policy';
  return 'refused';
}

function egressRow(r) {
  const where = r.host ? `${r.host}${r.port ? `:${r.port}` : ''}` : '(summary)';
  return el(
    'tr',
    {class: verdictClass(r.verdict), 'data-egress': r.id},
    el('td', {}, shortTime(r.started_at)),
    el('td', {}, r.method ?? ''),
    el('td', {class: 'host'}, where),
    el('td', {}, r.verdict ?? ''),
    el('td', {}, r.reason ?? ''),
    el('td', {class: 'num'}, humanBytes(r.bytes_up)),
    el('td', {class: 'num'}, humanBytes(r.bytes_down)),
  );
}

function renderEgress(section) {
  const t = table('egress-rows', ['Time', 'Method', 'Host', 'Verdict', 'Reason', 'Up', 'Down']);
  const empty = el('p', {class: 'empty'}, 'No connections yet.');
  section.append(el('h2', {}, 'Network'), empty, t.wrap);
  return (rows) => {
    empty.hidden = rows.length > 0;
    // Newest first. Ended connections change (bytes, duration): the signature rebuilds them.
    syncChildren(t.body, [...rows].reverse(), {
      key: (r) => r.id,
      sig: (r) => `${r.ended_at}|${r.bytes_up}|${r.bytes_down}|${r.verdict}`,
      make: egressRow,
    });
  };
}

// --- The page ---

export async function renderVm(main, scope, id) {
  const title = el('h1', {}, 'VM ', el('code', {}, id));
  const facts = el('dl', {class: 'facts-inline'});
  const destroy = el('button', {id: 'destroy', type: 'button', class: 'danger'}, 'Destroy');
  const execs = el('section', {id: 'execs'});
  const filesSection = el('section', {id: 'files'});
  const egress = el('section', {id: 'egress'});
  main.append(el('header', {class: 'page-head'}, title, destroy), facts, execs, filesSection, egress);

  destroy.addEventListener('click', async () => {
    if (!(await confirmDestroy(id))) return;
    await act(destroy, async () => {
      await api(`/trybox/v1/vms/${enc(id)}`, {method: 'DELETE'});
      window.location.hash = '#/';
    });
  });

  const showExecs = renderExecs(scope, execs);
  const showEgress = renderEgress(egress);
  renderFiles(id, filesSection);

  let live = null; // whether the VM is running, once known
  scope.poll(2000, async () => {
    const [list, ps, audit] = await Promise.allSettled([
      api('/trybox/v1/vms'),
      api(`/trybox/v1/vms/${enc(id)}/execs`),
      api(`/trybox/v1/audit?vm=${enc(id)}&limit=200`),
    ]);
    if (!scope.alive) return;
    if (list.status === 'fulfilled') {
      const vm = (list.value.vms ?? []).find((v) => v.id === id);
      const wasLive = live;
      live = Boolean(vm);
      const pairs = vm
        ? [
            ['Image', vm.image],
            ['State', vm.state + (vm.note ? ` (${vm.note})` : '')],
            ['Memory', `${vm.memory_mib} MiB`],
            ['CPUs', vm.cpus],
            ['Privileged', vm.trust === 'guest_word'
              ? `${vm.privileged ? 'yes' : 'not recorded'}: every result is the guest\u2019s word`
              : 'no'],
            ['Created', timeText(vm.created_at)],
            ['Egress', vm.egress ? `${vm.egress.mode}${vm.egress.allow?.length ? `: ${vm.egress.allow.join(', ')}` : ''}` : '—'],
          ]
        : [['State', 'not running (destroyed, or not this daemon\u2019s)']];
      facts.replaceChildren(...pairs.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, String(v ?? '—'))]));
      destroy.disabled = !vm;
      if (!live && wasLive === null) filesSection.append(el('p', {class: 'empty'}, 'The VM is not running: its files cannot be read.'));
    }
    if (ps.status === 'fulfilled') showExecs(ps.value.execs ?? []);
    if (audit.status === 'fulfilled') showEgress(audit.value.egress ?? []);
    const failed = [list, ps, audit].find((x) => x.status === 'rejected');
    if (failed) throw failed.reason;
  }, 'poll:vm');
}
