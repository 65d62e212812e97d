// The overview (#/): what waits for a person, the VMs, the agent runs, the spare pool
// and the host's load, refreshed every 2 s.

import {el, table, syncChildren, setText, api, pageLink, humanDuration, humanBytes, nowSeconds} from './lib.js';
import {isRunning, runState, badge, approvalItem} from './runs.js';

const TASK_CHARS = 120;

function cellsOf(tr) {
  return tr.children;
}

// --- VMs ---

function vmRow(vm) {
  return el('tr', {'data-vm': vm.id}, el('td', {}, pageLink('vm', vm.id)), el('td'), el('td'), el('td'), el('td'), el('td'), el('td'));
}

function updateVmRow(tr, vm) {
  const c = cellsOf(tr);
  setText(c[1], vm.image);
  setText(c[2], humanDuration(nowSeconds() - vm.created_at));
  // A privileged VM's results are the guest's word (docs/security.md): said beside its state.
  const trust = vm.trust === 'guest_word' ? (vm.privileged ? ', privileged' : ', privilege not recorded') : '';
  setText(c[3], vm.state + trust + (vm.note ? ` (${vm.note})` : ''));
  setText(c[4], vm.memory_mib ? `${vm.memory_mib} MiB` : '—');
  setText(c[5], `${vm.execs ?? 0} / ${vm.running_execs ?? 0} running`);
  setText(c[6], vm.egress?.mode ?? '—');
}

// --- Runs ---

function runRow(run) {
  return el('tr', {'data-run': run.run}, el('td', {}, pageLink('run', run.run)), el('td', {class: 'task'}), el('td'), el('td'), el('td'), el('td'), el('td'));
}

function updateRunRow(tr, run) {
  const c = cellsOf(tr);
  const task = run.task ?? '';
  setText(c[1], task.length > TASK_CHARS ? `${task.slice(0, TASK_CHARS)}…` : task);
  c[1].title = task;
  const state = runState(run);
  if (c[2].dataset.state !== state) {
    c[2].dataset.state = state;
    c[2].replaceChildren(badge(state));
  }
  const verdict = run.verdict ?? '';
  if (c[3].dataset.verdict !== verdict) {
    c[3].dataset.verdict = verdict;
    c[3].replaceChildren(verdict ? badge(verdict) : '—');
  }
  const turns = run.turns ?? run.usage?.turns;
  setText(c[4], turns ?? '—');
  const end = isRunning(run.outcome) ? nowSeconds() : run.updated_at;
  setText(c[5], humanDuration(end - run.created_at));
  if (c[6].dataset.vm !== (run.vm ?? '')) {
    c[6].dataset.vm = run.vm ?? '';
    c[6].replaceChildren(run.vm ? pageLink('vm', run.vm) : '—');
  }
}

// --- The host ---

function renderStatus(pool, load, st) {
  const spares = Object.entries(st.spares ?? {});
  pool.replaceChildren(
    el('h2', {}, 'Spare pool'),
    spares.length === 0
      ? el('p', {}, 'No spare clones ready.')
      : el('dl', {}, spares.map(([shape, n]) => [el('dt', {}, shape), el('dd', {}, `${n} ready`)])),
  );
  const h = st.host ?? {};
  const fix = (x) => (typeof x === 'number' ? x.toFixed(2) : '—');
  const mib = (x) => (typeof x === 'number' ? humanBytes(x * 1024 * 1024) : '—');
  load.replaceChildren(
    el('h2', {}, 'Host'),
    el(
      'dl',
      {},
      el('dt', {}, 'Load (1, 5, 15 min)'),
      el('dd', {}, `${fix(h.load1)} ${fix(h.load5)} ${fix(h.load15)}`),
      el('dt', {}, 'CPUs'),
      el('dd', {}, h.cpus ?? '—'),
      el('dt', {}, 'Memory available'),
      el('dd', {}, `${mib(h.mem_available_mib)} of ${mib(h.mem_total_mib)}`),
      el('dt', {}, 'Live VMs'),
      el('dd', {}, st.vms ?? '—'),
      el('dt', {}, 'Daemon'),
      el('dd', {}, `${st.version ?? ''} · up ${humanDuration(st.uptime_s)}`),
    ),
  );
}

export async function renderOverview(main, scope) {
  const vms = table('vms', ['VM', 'Image', 'Age', 'State', 'Memory', 'Execs', 'Egress']);
  const runs = table('runs', ['Run', 'Task', 'State', 'Verdict', 'Turns', 'Elapsed', 'VM']);
  const noVms = el('p', {class: 'empty', hidden: true}, 'No VMs are running.');
  const noRuns = el('p', {class: 'empty', hidden: true}, 'No agent runs yet.');
  const approvalList = el('div', {class: 'approval-list'});
  const noApprovals = el('p', {class: 'empty'}, 'Nothing waits for you.');
  const pool = el('section', {id: 'pool', class: 'panel'});
  const load = el('section', {id: 'load', class: 'panel'});
  main.append(
    el('h1', {}, 'Overview'),
    el('section', {id: 'approvals', 'aria-labelledby': 'approvals-h'}, el('h2', {id: 'approvals-h'}, 'Waiting for you'), noApprovals, approvalList),
    el('section', {'aria-labelledby': 'vms-h'}, el('h2', {id: 'vms-h'}, 'VMs'), noVms, vms.wrap),
    el('section', {'aria-labelledby': 'runs-h'}, el('h2', {id: 'runs-h'}, 'Agent runs'), noRuns, runs.wrap),
    el('div', {class: 'panels'}, pool, load),
  );

  const poller = scope.poll(2000, async () => {
    const [v, r, a, s] = await Promise.allSettled([
      api('/trybox/v1/vms'),
      api('/trybox/v1/agent-runs?limit=50'),
      api('/trybox/v1/approvals'),
      api('/trybox/v1/status'),
    ]);
    if (!scope.alive) return;
    if (v.status === 'fulfilled') {
      const list = v.value.vms ?? [];
      syncChildren(vms.body, list, {key: (x) => x.id, make: vmRow, update: updateVmRow});
      noVms.hidden = list.length > 0;
    }
    if (r.status === 'fulfilled') {
      const list = r.value.runs ?? [];
      syncChildren(runs.body, list, {key: (x) => x.run, make: runRow, update: updateRunRow});
      noRuns.hidden = list.length > 0;
    }
    if (a.status === 'fulfilled') {
      const list = a.value.approvals ?? [];
      syncChildren(approvalList, list, {
        key: (x) => x.run,
        // Rebuilt only when what it asks changes: a poll keeps the words being typed.
        sig: (x) => JSON.stringify([x.kind, x.state, x.why, x.host, x.port, x.question, x.since]),
        make: (x) => approvalItem(x, () => poller.now()),
      });
      noApprovals.hidden = list.length > 0;
    }
    if (s.status === 'fulfilled') renderStatus(pool, load, s.value);
    const failed = [v, r, a, s].find((x) => x.status === 'rejected');
    if (failed) throw failed.reason;
  }, 'poll:overview');
}
