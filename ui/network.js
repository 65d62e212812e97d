// The egress audit (#/network): every connection of every VM, filtered by VM, verdict
// and host, a summary per host, and a chart of the bytes moved per minute.

import {el, svg, table, api, act, enc, setText, pageLink, humanBytes, shortTime, timeText} from './lib.js';
import {isAllowed, verdictClass} from './vm.js';

const PAGE = 1000;

function auditRow(r) {
  return el(
    'tr',
    {class: verdictClass(r.verdict), 'data-egress': r.id},
    el('td', {}, timeText(r.started_at)),
    el('td', {}, r.vm ? pageLink('vm', r.vm) : '—'),
    el('td', {}, r.method ?? ''),
    el('td', {class: 'host'}, r.host || '(summary)'),
    el('td', {class: 'num'}, r.port || ''),
    el('td', {}, r.verdict ?? ''),
    el('td', {}, r.reason ?? ''),
    el('td', {class: 'num'}, r.status || ''),
    el('td', {class: 'num'}, humanBytes(r.bytes_up)),
    el('td', {class: 'num'}, humanBytes(r.bytes_down)),
  );
}

function hostRows(rows) {
  const by = new Map();
  for (const r of rows) {
    const key = r.host || '(summary)';
    const h = by.get(key) ?? {host: key, connections: 0, allowed: 0, refused: 0, up: 0, down: 0};
    h.connections++;
    if (isAllowed(r.verdict)) h.allowed++;
    else if (r.verdict !== 'policy') h.refused++;
    h.up += r.bytes_up ?? 0;
    h.down += r.bytes_down ?? 0;
    by.set(key, h);
  }
  return [...by.values()]
    .sort((a, b) => b.connections - a.connections || a.host.localeCompare(b.host))
    .map((h) =>
      el(
        'tr',
        {class: h.refused > 0 && h.allowed === 0 ? 'refused' : null},
        el('td', {class: 'host'}, h.host),
        el('td', {class: 'num'}, h.connections),
        el('td', {class: 'num'}, h.allowed),
        el('td', {class: 'num'}, h.refused),
        el('td', {class: 'num'}, humanBytes(h.up)),
        el('td', {class: 'num'}, humanBytes(h.down)),
      ),
    );
}

// Bars of bytes (up and down stacked) per time step; the step is a minute, wider when
// the rows span more than ~2 hours, so there are never more than 120 bars.
function drawChart(chart, rows) {
  const W = 960;
  const H = 160;
  const PAD = 18;
  chart.replaceChildren();
  if (rows.length === 0) {
    chart.append(svg('text', {x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'chart-label'}, 'No connections'));
    return;
  }
  const times = rows.map((r) => r.started_at);
  const t0 = Math.min(...times);
  const t1 = Math.max(...times);
  const steps = [60, 300, 900, 3600, 4 * 3600, 86400];
  const step = steps.find((s) => (t1 - t0) / s < 120) ?? 86400 * 7;
  const first = Math.floor(t0 / step);
  const n = Math.floor(t1 / step) - first + 1;
  const up = new Array(n).fill(0);
  const down = new Array(n).fill(0);
  for (const r of rows) {
    const i = Math.floor(r.started_at / step) - first;
    up[i] += r.bytes_up ?? 0;
    down[i] += r.bytes_down ?? 0;
  }
  const most = Math.max(...up.map((u, i) => u + down[i]));
  const max = Math.max(1, most);
  const barW = (W - 2) / n;
  const plotH = H - PAD * 2;
  chart.append(svg('line', {x1: 0, y1: H - PAD, x2: W, y2: H - PAD, class: 'chart-axis'}));
  for (let i = 0; i < n; i++) {
    const total = up[i] + down[i];
    if (total === 0) continue;
    const hDown = (down[i] / max) * plotH;
    const hUp = (up[i] / max) * plotH;
    const x = 1 + i * barW;
    const w = Math.max(1, barW - 1);
    const label = `${shortTime((first + i) * step)}: ${humanBytes(down[i])} down, ${humanBytes(up[i])} up`;
    chart.append(
      svg(
        'g',
        {},
        svg('title', {}, label),
        svg('rect', {x, y: H - PAD - hDown, width: w, height: Math.max(hDown, 0), class: 'bar-down'}),
        svg('rect', {x, y: H - PAD - hDown - hUp, width: w, height: Math.max(hUp, 0), class: 'bar-up'}),
      ),
    );
  }
  const unit = step === 60 ? 'minute' : `${step / 60} minutes`;
  chart.append(
    svg('text', {x: 2, y: 12, class: 'chart-label'}, most > 0 ? `max ${humanBytes(most)} per ${unit}` : 'no bytes moved'),
    svg('text', {x: 2, y: H - 4, class: 'chart-label'}, shortTime(first * step)),
    svg('text', {x: W - 2, y: H - 4, 'text-anchor': 'end', class: 'chart-label'}, shortTime((first + n) * step)),
  );
  chart.setAttribute('aria-label', `Bytes per ${unit}, ${n} bars, at most ${humanBytes(max)}`);
}

export async function renderNetwork(main, scope) {
  const vmInput = el('input', {id: 'filter-vm', type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: 'all VMs'});
  const verdict = el('select', {id: 'filter-verdict'}, el('option', {value: ''}, 'all'));
  const hostInput = el('input', {id: 'filter-host', type: 'search', autocomplete: 'off', spellcheck: 'false', placeholder: 'any host'});
  const refresh = el('button', {id: 'refresh', type: 'button'}, 'Refresh');
  const older = el('button', {id: 'older', type: 'button'}, 'Older');
  const count = el('p', {class: 'count', 'aria-live': 'polite'});
  const audit = table('audit', ['Time', 'VM', 'Method', 'Host', 'Port', 'Verdict', 'Reason', 'Status', 'Up', 'Down']);
  const hosts = table('hosts', ['Host', 'Connections', 'Allowed', 'Refused', 'Up', 'Down']);
  const chart = svg('svg', {id: 'bytes-chart', viewBox: '0 0 960 160', width: 960, height: 160, role: 'img', 'aria-label': 'Bytes per minute'});

  const field = (id, text, input) => el('div', {class: 'field'}, el('label', {for: id}, text), input);
  main.append(
    el('h1', {}, 'Network'),
    el('form', {class: 'filters', role: 'search'}, field('filter-vm', 'VM', vmInput), field('filter-verdict', 'Verdict', verdict), field('filter-host', 'Host contains', hostInput), refresh),
    el('section', {'aria-labelledby': 'chart-h'}, el('h2', {id: 'chart-h'}, 'Bytes over time'), el('div', {class: 'chart-wrap'}, chart), el('p', {class: 'hint'}, 'Bytes down (lower bar) and up (upper bar) of the connections shown, by when they started.')),
    el('section', {'aria-labelledby': 'hosts-h'}, el('h2', {id: 'hosts-h'}, 'Hosts'), hosts.wrap),
    el('section', {'aria-labelledby': 'audit-h'}, el('h2', {id: 'audit-h'}, 'Connections'), count, audit.wrap, older),
  );

  let rows = []; // oldest first, as the server pages them
  let nextBefore = null;

  const show = () => {
    const v = verdict.value;
    const h = hostInput.value.trim().toLowerCase();
    const shown = rows.filter((r) => (!v || r.verdict === v) && (!h || (r.host ?? '').toLowerCase().includes(h)));
    // The verdicts seen so far, the chosen one kept even when none of its rows are left.
    const verdicts = [...new Set(rows.map((r) => r.verdict).concat(v ? [v] : []))].sort();
    if (verdicts.join('|') !== [...verdict.options].slice(1).map((o) => o.value).join('|')) {
      verdict.replaceChildren(el('option', {value: ''}, 'all'), ...verdicts.map((x) => el('option', {value: x}, x)));
      verdict.value = v;
    }
    audit.body.replaceChildren(...shown.slice().reverse().map(auditRow));
    hosts.body.replaceChildren(...hostRows(shown));
    drawChart(chart, shown);
    setText(count, `${shown.length} of ${rows.length} connections loaded${nextBefore === null ? ' (all there are)' : ''}.`);
    older.disabled = nextBefore === null;
  };

  const query = (before) => {
    const vm = vmInput.value.trim();
    return `/trybox/v1/audit?limit=${PAGE}${vm ? `&vm=${enc(vm)}` : ''}${before !== undefined ? `&before_id=${before}` : ''}`;
  };

  const load = async () => {
    await act(refresh, async () => {
      const r = await api(query());
      if (!scope.alive) return;
      rows = r.egress ?? [];
      nextBefore = r.next_before_id ?? null;
      show();
    });
    older.disabled = nextBefore === null;
  };

  older.addEventListener('click', async () => {
    await act(older, async () => {
      if (nextBefore === null) return;
      const r = await api(query(nextBefore));
      if (!scope.alive) return;
      rows = (r.egress ?? []).concat(rows);
      nextBefore = r.next_before_id ?? null;
      show();
    });
    older.disabled = nextBefore === null;
  });
  refresh.addEventListener('click', load);
  verdict.addEventListener('change', show);
  hostInput.addEventListener('input', show);
  // The VM filter asks the server (only that VM's rows, paged on their own).
  let typing = null;
  vmInput.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(load, 400);
  });
  scope.onDispose(() => clearTimeout(typing));
  main.querySelector('form.filters').addEventListener('submit', (e) => {
    e.preventDefault();
    clearTimeout(typing);
    load();
  });
  await load();
}
