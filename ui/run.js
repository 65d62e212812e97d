// One agent run (#/run/ID). What the daemon verified and what the agent claims are kept
// apart on the page, as in the report: facts from the daemon's records under "Verified
// by the daemon", the agent's summary quoted under "The agent's claim (not verified)".

import {el, api, act, enc, reload, showError, pageLink, argvText, execEnding, humanBytes, humanMs, humanDuration, timeText, nowSeconds} from './lib.js';
import {OutputView, followExec, openStream, outputText} from './output.js';
import {FINISHED, isRunning, runState, badge, answering, working, approvalItem} from './runs.js';

// Output is loaded by itself for this many of the newest commands; older ones on request.
const AUTO_OUTPUT = 20;
// The live log keeps this many entries (progress lines and commands).
const LIVE_ENTRIES = 300;

function section(id, title, ...children) {
  return el('section', {id, 'aria-labelledby': `${id}-h`}, el('h2', {id: `${id}-h`}, title), ...children);
}

function dl(pairs) {
  return el('dl', {class: 'facts'}, pairs.filter(Boolean).flatMap(([k, ...v]) => [el('dt', {}, k), el('dd', {}, ...v)]));
}

// --- Verified by the daemon ---

function verificationPairs(v) {
  if (!v) return [['Verification', 'none ran (no command was given, or the run has not finished)']];
  const pairs = [
    ['Verification command', el('code', {}, v.command ?? ''), ` (from the ${v.source ?? '?'}${v.user ? `, run as the account ${v.user}` : ''})`],
    ['Re-run in a fresh VM', execEnding(v) || v.outcome, v.duration_ms !== undefined ? ` in ${humanMs(v.duration_ms)}` : '', v.vm ? [' · VM ', el('code', {}, v.vm)] : ''],
  ];
  if (v.error) pairs.push(['Re-run error', v.error]);
  if (v.output_tail) {
    const cut = v.output_bytes > v.output_tail_bytes ? ` (the last ${humanBytes(v.output_tail_bytes)} of ${humanBytes(v.output_bytes)})` : '';
    pairs.push([`Re-run output${cut}`, el('pre', {class: 'output', tabindex: '0'}, v.output_tail)]);
  }
  return pairs;
}

function networkPart(net) {
  if (!net) return 'not recorded';
  const p = net.policy ?? {};
  const policy = [p.mode, p.allow?.length ? `allow ${p.allow.join(', ')}` : '', p.profiles?.length ? `profiles ${p.profiles.join(', ')}` : '', p.deny?.length ? `deny ${p.deny.join(', ')}` : '']
    .filter(Boolean)
    .join('; ');
  const list = (items, text) => (items?.length ? el('ul', {}, items.map((x) => el('li', {}, text(x)))) : null);
  return [
    el('p', {}, `Policy: ${policy}. ${net.connections ?? 0} connections${net.truncated ? ' (the newest 10,000 read)' : ''}.`),
    net.error ? el('p', {}, net.error) : null,
    list(net.reached, (h) => `reached ${h.host}:${h.port} · ${h.connections}× · ${humanBytes(h.bytes_up)} up, ${humanBytes(h.bytes_down)} down`),
    list(net.refused, (h) => `${h.verdict} ${h.host}:${h.port}${h.count > 1 ? ` ×${h.count}` : ''}${h.reason ? ` · ${h.reason}` : ''}`),
    list(net.changes, (c) => `${c.change} ${c.entry}${c.reason ? ` · ${c.reason}` : ''}`),
  ];
}

function factsSection(rep) {
  const files = rep.files;
  const counts = files?.counts ? Object.entries(files.counts).filter(([, n]) => n).map(([k, n]) => `${n} ${k}`).join(', ') : '';
  const usage = rep.usage ?? {};
  const end = isRunning(rep.outcome) ? nowSeconds() : rep.updated_at;
  return section(
    'facts',
    'Verified by the daemon',
    el('p', {class: 'hint'}, 'From tryboxd\u2019s own records: its run record, its exec table, the collect, the re-run and the egress audit.'),
    dl([
      ['Outcome', badge(runState(rep)), rep.reason ? ` ${rep.reason}` : ''],
      rep.verdict && ['Verdict', badge(rep.verdict)],
      rep.error && ['Error', `${rep.error.kind ?? ''}: ${rep.error.message ?? ''}`],
      ...verificationPairs(rep.verification),
      ['Commit', rep.commit ? [el('code', {}, (rep.commit.sha ?? '').slice(0, 12)), ` on ${rep.commit.branch ?? '?'}`, rep.commit.repo ? ` in ${rep.commit.repo}` : ''] : rep.commit_note ?? 'none'],
      ['Files changed', files ? `${files.changes_total ?? 0}${counts ? ` (${counts})` : ''}` : rep.files_note ?? 'not collected yet'],
      ['Commands', `${rep.commands?.length ?? 0} by the agent${rep.other_commands?.length ? `, ${rep.other_commands.length} by others in its VM` : ''}`],
      ['Network', networkPart(rep.network)],
      ['VM', rep.vm?.id ? [pageLink('vm', rep.vm.id), ` (${rep.vm.state})`] : '—'],
      ['Image', rep.image?.name ?? '—', rep.image?.sha256 ? [' ', el('code', {}, rep.image.sha256.slice(0, 12))] : ''],
      ['Model', [rep.model?.provider, rep.model?.model].filter(Boolean).join(' · ') || '—'],
      ['Usage', `${usage.turns ?? 0} turn${usage.turns === 1 ? '' : 's'} · ${usage.input_tokens ?? 0} tokens in, ${usage.output_tokens ?? 0} out · model ${humanMs(usage.model_ms)}`],
      ['Started', timeText(rep.created_at), ` · ${humanDuration(end - rep.created_at)}${isRunning(rep.outcome) ? ' so far' : ''}`],
      rep.expired && ['Expired', String(rep.expired)],
    ]),
  );
}

// --- The agent's words ---

function claimSection(rep) {
  const claim = rep.claim;
  const parts = [];
  if (claim) {
    parts.push(el('blockquote', {id: 'claim', class: 'claim'}, claim.summary ?? ''));
    if (claim.truncated) parts.push(el('p', {class: 'hint'}, 'The summary was cut at 4,000 characters.'));
    parts.push(el('p', {class: `claim-status claim-${claim.status}`}, claim.status === 'contradicted' ? 'The re-run contradicts it: the verification failed.' : 'Status: unverified. A passing re-run verifies the command, not the prose.'));
  } else {
    parts.push(el('p', {class: 'empty'}, 'No claim: the agent has not finished.'));
  }
  if (rep.answers?.length) parts.push(el('h3', {}, 'Answers given'), el('ol', {}, rep.answers.map((a) => el('li', {}, a))));
  return section('claim-section', 'The agent\u2019s claim (not verified)', ...parts);
}

// --- Commands ---

function callItem(scope, c, n, auto) {
  const view = new OutputView();
  const more = el('div', {class: 'exec-more'});
  const item = el(
    'article',
    {class: 'exec', 'data-call': n},
    el('h3', {}, el('span', {class: 'exec-id'}, `${c.tool ?? 'exec'} #${c.exec_id ?? '?'}`), ' ', el('code', {class: 'argv'}, `$ ${argvText(c.argv)}`)),
    el('p', {class: 'exec-line'}, el('span', {class: `exec-state ${c.outcome === 'exited' && c.exit_code === 0 ? 'ok' : c.outcome === 'running' ? 'running' : 'bad'}`}, execEnding(c)), ` · ${humanMs(c.duration_ms)} · ${humanBytes(c.stdout_bytes)} out, ${humanBytes(c.stderr_bytes)} err`, c.cwd ? ` · in ${c.cwd}` : ''),
    more,
  );
  if (c.exec_id === undefined || c.exec_id === null) return item;
  item.append(view.pre);
  const running = c.outcome === 'running';
  const follow = () => followExec(scope, c.exec_id, view, {stdoutBytes: c.stdout_bytes, stderrBytes: c.stderr_bytes, running, first: running});
  if (auto || running) {
    follow();
  } else {
    const button = el('button', {type: 'button', class: 'load-output'}, 'Show output');
    button.addEventListener('click', () => {
      button.remove();
      follow();
    });
    more.append(button);
  }
  return item;
}

function callsSection(scope, rep) {
  const commands = rep.commands ?? [];
  const others = rep.other_commands ?? [];
  const parts = [el('p', {class: 'hint'}, 'From the exec table of the run\u2019s VM. Exit codes are what the guest reported.')];
  if (commands.length === 0) parts.push(el('p', {class: 'empty'}, 'No commands yet.'));
  commands.forEach((c, i) => parts.push(callItem(scope, c, i, i >= commands.length - AUTO_OUTPUT)));
  if (others.length) {
    parts.push(el('h3', {}, 'Commands others ran in its VM (not the agent\u2019s)'));
    others.forEach((c, i) => parts.push(callItem(scope, c, `other-${i}`, false)));
  }
  return section('calls', 'Commands', ...parts);
}

// --- Files changed ---

function changeLine(c) {
  let sizes = '';
  if (c.old_size !== undefined && c.new_size !== undefined) sizes = ` (${humanBytes(c.old_size)} → ${humanBytes(c.new_size)})`;
  else if (c.new_size !== undefined || c.old_size !== undefined) sizes = ` (${humanBytes(c.new_size ?? c.old_size)})`;
  const modes = c.old_mode !== undefined && c.new_mode !== undefined ? ` (mode ${c.old_mode.toString(8)} → ${c.new_mode.toString(8)})` : '';
  return `${(c.change ?? '?').padEnd(12)} ${c.from ? `${c.from} → ` : ''}${c.path}${sizes}${modes}\n`;
}

function renderChanges(target, collect) {
  const changes = collect.changes ?? [];
  const total = collect.changes_total ?? changes.length;
  const nodes = [];
  if (changes.length === 0) nodes.push(el('p', {class: 'empty'}, 'No files changed.'));
  else nodes.push(el('pre', {class: 'changes', tabindex: '0'}, changes.map(changeLine).join('')));
  if (total > changes.length) nodes.push(el('p', {class: 'hint'}, `Showing ${changes.length} of ${total} changes.`));
  // A patch, should an entry carry one.
  for (const c of changes) {
    const patch = c.patch ?? c.diff;
    if (typeof patch === 'string' && patch) nodes.push(el('h3', {}, c.path), el('pre', {class: 'patch', tabindex: '0'}, patch));
  }
  target.replaceChildren(...nodes);
}

// A patch as text, each line in a span whose class says what it is (added, removed, a
// hunk or file header), so the stylesheet can colour it; the text itself is never markup.
function renderPatch(text) {
  const pre = el('pre', {class: 'patch', tabindex: '0', id: 'patch'});
  for (const line of text.split('\n')) {
    const kind = line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff ') ? 'file'
      : line.startsWith('+') ? 'add'
      : line.startsWith('-') ? 'del'
      : line.startsWith('@@') ? 'hunk'
      : null;
    pre.append(kind ? el('span', {class: kind}, `${line}\n`) : `${line}\n`);
  }
  return pre;
}

// The run's commit as a patch (the diff route with patch=1), under the list of changes.
async function loadPatch(target, vm) {
  try {
    const r = await api(`/trybox/v1/vms/${enc(vm)}/diff?limit=1&patch=1`);
    const p = r.patch ?? {};
    const text = outputText(p);
    const nodes = [el('h3', {}, `Patch of ${String(p.commit ?? '').slice(0, 12)}`)];
    if (text) nodes.push(renderPatch(text));
    else nodes.push(el('p', {class: 'empty'}, 'The commit changes no file\u2019s content.'));
    if (p.truncated) nodes.push(el('p', {class: 'hint'}, `The first ${humanBytes(text.length)} of ${humanBytes(p.bytes)} shown.`));
    target.replaceChildren(...nodes);
  } catch (e) {
    target.replaceChildren(el('p', {class: 'hint'}, `No patch: ${e.message}`));
  }
}

function diffSection(rep) {
  const body = el('div');
  if (rep.files) {
    renderChanges(body, rep.files);
    if (rep.vm?.id) {
      const patch = el('div', {id: 'patch-box'});
      body.append(patch);
      loadPatch(patch, rep.vm.id);
    }
  } else {
    body.append(el('p', {class: 'empty'}, rep.files_note ?? 'Nothing collected yet: the run\u2019s work is collected when it finishes.'));
    // Someone may have collected the VM by hand meanwhile; asked only on request, as the
    // usual answer is an error.
    if (rep.vm?.id) {
      const look = el('button', {type: 'button', id: 'diff-load'}, 'Show the VM\u2019s newest collect');
      look.addEventListener('click', () =>
        act(look, async () => {
          const r = await api(`/trybox/v1/vms/${enc(rep.vm.id)}/diff?limit=2000`);
          renderChanges(body, r.collect ?? {});
        }),
      );
      body.append(look);
    }
  }
  return section('diff', 'Files changed', body);
}

// --- Transcript ---

function preview(text) {
  const t = String(text ?? '').replace(/\s+/g, ' ').trim();
  return t.length > 90 ? `${t.slice(0, 90)}…` : t;
}

function callArgsText(call) {
  return call.raw_arguments ?? JSON.stringify(call.input ?? {});
}

function transcriptEntry(e, i) {
  const body = [];
  let label = e.kind ?? '?';
  let first = e.text ?? '';
  if (e.text) body.push(el('pre', {class: 'text'}, e.text));
  for (const c of e.calls ?? []) {
    const args = c.input_error ? `${c.raw_arguments ?? ''}\n(could not be read: ${c.input_error})` : JSON.stringify(c.input ?? {}, null, 2);
    body.push(el('p', {class: 'call'}, 'Calls ', el('code', {}, c.name ?? '?')), el('pre', {class: 'args'}, args));
  }
  if (e.calls?.length) {
    label += ` · ${e.calls.map((c) => c.name).join(', ')}`;
    if (!first) first = callArgsText(e.calls[0]);
  }
  for (const r of e.results ?? []) {
    body.push(el('p', {class: r.is_error ? 'result error' : 'result'}, `Result of ${r.name ?? '?'}${r.is_error ? ' (error)' : ''}`), el('pre', {class: 'text'}, r.content ?? ''));
    if (!first) first = r.content ?? '';
  }
  return el('details', {class: `entry entry-${e.kind}`}, el('summary', {}, el('span', {class: 'role'}, `${i + 1}. ${label}`), ' ', el('span', {class: 'preview'}, preview(first))), ...body);
}

function transcriptSection(id) {
  const body = el('div', {}, el('p', {class: 'empty'}, 'Loading…'));
  api(`/trybox/v1/agent-runs/${enc(id)}/transcript`)
    .then((r) => {
      const entries = r.entries ?? [];
      body.replaceChildren(...(entries.length ? entries.map(transcriptEntry) : [el('p', {class: 'empty'}, 'No transcript yet.')]));
    })
    .catch((e) => body.replaceChildren(el('p', {class: 'empty'}, `The transcript could not be read (${e.message}).`)));
  return section('transcript', 'Transcript', el('p', {class: 'hint'}, 'The conversation with the model: its words, unverified.'), body);
}

// --- Live ---

const eventsUrl = (id) => `/trybox/v1/agent-runs/${enc(id)}/events`;

// Follows a working run: progress, each command with its output, how it ended. A
// reconnection replays the call from its start, so the log starts again then. When the
// call ends the page is shown again from the new report.
function liveSection(scope, id) {
  const log = el('div', {class: 'live-log'});
  const sec = section('live', 'Live', log);
  const blocks = new Map();
  let last = null;
  let sawEvent = false;
  const add = (node) => {
    log.append(node);
    while (log.children.length > LIVE_ENTRIES) log.firstChild.remove();
    return node;
  };
  const handlers = {
    open: () => {
      log.replaceChildren();
      blocks.clear();
    },
    progress: (d) => {
      sawEvent = true;
      const p = d.progress ?? {};
      // The daemon's words already name the turn ("turn 2: asking the model").
      add(el('p', {class: 'progress', title: `turn ${p.turn ?? '?'} of at most ${p.max_turns ?? '?'}`}, p.message ?? ''));
    },
    exec: (d) => {
      sawEvent = true;
      const x = d.exec ?? {};
      const view = new OutputView(64 * 1024);
      const block = add(el('div', {class: 'live-exec'}, el('p', {class: 'cmd'}, el('code', {}, `$ ${argvText(x.argv)}`), ` (${x.tool ?? 'exec'})`), view.pre));
      last = {view, block};
      if (x.exec_id !== undefined) blocks.set(x.exec_id, last);
    },
    output: (d) => {
      const o = d.output ?? {};
      (blocks.get(o.exec_id) ?? last)?.view.append(o.stream, outputText(o));
    },
    exec_end: (d) => {
      const o = d.exec_end ?? {};
      const b = blocks.get(o.exec_id) ?? last;
      if (!b) return;
      if (o.output_tail) b.view.append('stdout', o.output_tail);
      b.block.append(el('p', {class: 'end'}, `[${execEnding(o.result)}]`));
    },
    message: (d) => {
      if (d.outcome) add(el('p', {class: 'outcome'}, `${d.outcome}${d.reason ? `: ${d.reason}` : ''}`));
    },
    end: (d) => {
      const later = (ms, fn) => {
        const t = setTimeout(() => scope.alive && fn(), ms);
        scope.onDispose(() => clearTimeout(t));
      };
      // Nothing came: the call had not started yet (an answer just taken), or had just
      // ended. While our answer streams, look again; otherwise show the page again, after
      // a pause if the report still says RUNNING, so that this is never a tight loop.
      if (!sawEvent && answering.has(id)) {
        later(1000, follow);
        return;
      }
      working.delete(id);
      later(isRunning(d.report?.outcome) ? 2000 : 0, reload);
    },
    error: (d) => showError(`run ${id}: ${d.message ?? 'the stream failed'}`),
  };
  function follow() {
    const stream = openStream(eventsUrl(id), handlers, {first: true});
    scope.onDispose(stream.close);
  }
  follow();
  return sec;
}

// Whether a run that is not RUNNING by its record works all the same: a call made by
// another client (an answer or resume from the CLI) is not in the record until it ends.
// Its events stream says so: events while a call works, else the report at once. Also
// shows the page again when the report changed meanwhile.
function watchForWork(scope, rep) {
  const id = rep.run;
  let current = null;
  scope.onDispose(() => current?.close());
  scope.poll(5000, () =>
    new Promise((resolve) => {
      const done = () => {
        current?.close();
        current = null;
        resolve();
      };
      const seen = () => {
        done();
        working.add(id);
        if (scope.alive) reload();
      };
      current = openStream(eventsUrl(id), {
        progress: seen,
        exec: seen,
        run: seen,
        end: (d) => {
          const now = d.report ?? {};
          done();
          if (scope.alive && (now.outcome !== rep.outcome || now.updated_at !== rep.updated_at)) reload();
        },
        error: done,
      });
    }), 'poll:run');
}

// --- Waiting for a person ---

// The answer controls, and a watch on the approvals list: a VM that went away shows the
// page again (the request then cannot be carried out).
function waitingSection(scope, rep, approvals) {
  const id = rep.run;
  let a = approvals.find((x) => x.run === id);
  if (!a && rep.outcome === 'NEEDS_INPUT') {
    a = rep.approval
      ? {kind: 'network', run: id, host: rep.approval.host, port: rep.approval.port, reason: rep.approval.reason, state: 'pending'}
      : {kind: 'agent_question', run: id, question: rep.question?.text ?? '', state: 'pending'};
  }
  if (!a) return null;
  const sig = (x) => (x ? JSON.stringify([x.kind, x.state, x.question, x.host, x.port]) : '');
  const seen = approvals.find((x) => x.run === id);
  scope.poll(2000, async () => {
    if (answering.has(id)) return;
    const r = await api('/trybox/v1/approvals');
    const now = (r.approvals ?? []).find((x) => x.run === id);
    // Gone from the list means busy (being answered elsewhere): watchForWork sees that.
    if (scope.alive && now && sig(now) !== sig(seen)) reload();
  }, 'poll:approvals');
  // Once the answer is taken the run works: the page follows it.
  const item = approvalItem({...a, task: ''}, () => scope.alive && reload(), {ids: true});
  return section('waiting', 'Waiting for you', item);
}

// --- The page ---

export async function renderRun(main, scope, id) {
  main.append(el('h1', {}, 'Run ', el('code', {}, id)));
  const [r, ap] = await Promise.all([api(`/trybox/v1/agent-runs/${enc(id)}`), api('/trybox/v1/approvals').catch(() => ({approvals: []}))]);
  if (!scope.alive) return;
  const rep = r.report ?? {};
  rep.run ??= id;
  const live = runState(rep) === 'RUNNING';

  const head = el('div', {class: 'run-head'}, badge(runState(rep)), rep.verdict ? badge(rep.verdict) : null);
  if (!FINISHED.has(rep.outcome)) {
    const cancel = el('button', {id: 'cancel', type: 'button', class: 'danger'}, 'Cancel the run');
    cancel.addEventListener('click', () =>
      act(cancel, async () => {
        await api(`/trybox/v1/agent-runs/${enc(id)}/cancel`, {method: 'POST'});
        working.delete(id);
        reload();
      }),
    );
    head.append(cancel);
  }
  main.append(head, el('p', {class: 'task'}, 'Task: ', el('q', {}, rep.task ?? '')));

  if (live) {
    main.append(liveSection(scope, id));
  } else if (!FINISHED.has(rep.outcome)) {
    const waiting = waitingSection(scope, rep, ap.approvals ?? []);
    if (waiting) main.append(waiting);
    watchForWork(scope, rep);
  }
  main.append(factsSection(rep), claimSection(rep), callsSection(scope, rep), diffSection(rep), transcriptSection(id));
  if (r.text) main.append(el('details', {class: 'report-text'}, el('summary', {}, 'The report as text'), el('pre', {tabindex: '0'}, r.text)));
}
