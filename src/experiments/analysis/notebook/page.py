# ruff: noqa: E501  (the JavaScript and CSS below are text, laid out as JavaScript)
"""The report page's stylesheet and script (``report.html`` puts them inline; how the page
keeps run data as text and fetches nothing is in ``report``'s docstring).

``#sort=<column>&order=asc|desc&filter=<text>`` in the URL sorts and filters the table as a
click on a column's header and typing in the filter box do (a link that opens the page
sorted; the browser test uses it). When the page is drawn ``<body>`` gets ``data-ready``.
"""

PAGE_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666;margin:0 0 8px}.controls{margin:6px 0;display:flex;gap:10px;align-items:center;
flex-wrap:wrap}input,select,button{font:inherit}#filter{width:320px}
.wrap{max-height:520px;overflow:auto;border:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 8px;border-bottom:1px solid #eee;
text-align:left;white-space:nowrap;max-width:280px;overflow:hidden;text-overflow:ellipsis}
th{position:sticky;top:0;background:#f6f6f6;cursor:pointer;user-select:none}
th.sorted-asc::after{content:" \\25B2"}th.sorted-desc::after{content:" \\25BC"}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.st-broken td,tr.st-failed td{color:#a33}tr.st-running td{color:#06c}
.plot{width:100%;height:420px}.note{color:#555}.small{font-size:12px;color:#666}
"""

PAGE_JS = r"""
(function () {
'use strict';
var D = JSON.parse(document.getElementById('data').textContent);
function el(tag, attrs, text) {
  var e = document.createElement(tag);
  if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function esc(s) {  // for Plotly labels: it reads a few HTML tags, so none may get through
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}
function fmt(v, kind) {
  if (v === null || v === undefined) return '';
  if (kind === 'num' && typeof v === 'number') return Number.isInteger(v) ? String(v) : v.toPrecision(4);
  if (kind === 'date') return String(v).replace('T', ' ').slice(0, 16);
  return String(v);
}
var cols = D.columns, rows = D.rows, nameAt = 0;
var statusAt = cols.findIndex(function (c) { return c.key === 'status'; });
var hash = new URLSearchParams(location.hash.slice(1));
var state = {sort: null, desc: false, filter: hash.get('filter') || '', status: ''};
var checked = new Set();

// ---- header
document.body.appendChild(el('h1', null, D.title));
document.body.appendChild(el('p', {'class': 'meta'}, rows.length + ' runs under ' + D.root +
  (D.where ? ' where ' + D.where : '') + ' \u00b7 written ' + D.generated.replace('T', ' ')));

// ---- the table
document.body.appendChild(el('h2', null, 'Runs'));
var controls = el('div', {'class': 'controls'});
var filter = el('input', {id: 'filter', type: 'search', placeholder: 'filter: any text in a row'});
filter.value = state.filter;
var statusSel = el('select', {id: 'status'});
['', 'finished', 'running', 'failed', 'broken'].forEach(function (s) {
  statusSel.appendChild(el('option', {value: s}, s || 'every status'));
});
var shown = el('span', {id: 'shown', 'class': 'small'});
var best = el('button', {id: 'tick-best'}, 'tick the best ' + 10);
controls.append(filter, statusSel, best, shown);
document.body.appendChild(controls);
var wrap = el('div', {'class': 'wrap'});
var table = el('table', {id: 'runs'});
var thead = el('thead'), tbody = el('tbody'), hr = el('tr');
hr.appendChild(el('th', {title: 'plot this run\'s curves'}, '\u2713'));
cols.forEach(function (c, j) {
  var th = el('th', {'data-key': c.key}, c.key);
  th.addEventListener('click', function () { sortBy(c.key, state.sort === c.key ? !state.desc : c.kind !== 'text'); });
  hr.appendChild(th);
});
thead.appendChild(hr); table.append(thead, tbody); wrap.appendChild(table);
document.body.appendChild(wrap);
var trs = rows.map(function (r, i) {
  var tr = el('tr', {'data-i': i, 'class': 'st-' + r[statusAt]});
  var box = el('input', {type: 'checkbox'});
  box.addEventListener('change', function () { if (box.checked) checked.add(i); else checked.delete(i); drawCurves(); });
  var td0 = el('td'); td0.appendChild(box); tr.appendChild(td0);
  cols.forEach(function (c, j) {
    var td = el('td', {'class': c.kind === 'num' ? 'num' : (c.key === 'note' ? 'note' : '')}, fmt(r[j], c.kind));
    if (r[j] !== null && String(r[j]).length > 30) td.title = String(r[j]);
    tr.appendChild(td);
  });
  tr.shown_value = r.map(function (v) { return v === null ? '' : String(v).toLowerCase(); }).join(' \u0001 ');
  tr._box = box;
  tbody.appendChild(tr);
  return tr;
});
function applyFilter() {
  var f = state.filter.toLowerCase(), s = state.status, n = 0;
  trs.forEach(function (tr, i) {
    var ok = (!f || tr.shown_value.indexOf(f) >= 0) && (!s || rows[i][statusAt] === s);
    tr.hidden = !ok; if (ok) n++;
  });
  table.dataset.rows = n;
  shown.textContent = n + ' of ' + rows.length + ' shown';
}
function sortBy(key, desc) {
  var j = cols.findIndex(function (c) { return c.key === key; });
  if (j < 0) return;
  state.sort = key; state.desc = desc;
  var order = trs.slice().sort(function (a, b) {
    var x = rows[a.dataset.i][j], y = rows[b.dataset.i][j];
    if (x === null && y === null) return 0;
    if (x === null) return 1;  // missing values last, either way
    if (y === null) return -1;
    var c = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
    return desc ? -c : c;
  });
  order.forEach(function (tr) { tbody.appendChild(tr); });
  hr.querySelectorAll('th').forEach(function (th) {
    th.className = th.dataset.key === key ? (desc ? 'sorted-desc' : 'sorted-asc') : '';
  });
}
filter.addEventListener('input', function () { state.filter = filter.value; applyFilter(); });
statusSel.addEventListener('change', function () { state.status = statusSel.value; applyFilter(); });
function tickBest() {
  var m = D.metrics[0], j = cols.findIndex(function (c) { return c.key === m; });
  checked.clear();
  var lower = D.lower.indexOf(m) >= 0;
  var cand = rows.map(function (r, i) { return i; }).filter(function (i) {
    return !trs[i].hidden && D.curves[i] && j >= 0 && rows[i][j] !== null;
  });
  cand.sort(function (a, b) { return lower ? rows[a][j] - rows[b][j] : rows[b][j] - rows[a][j]; });
  cand.slice(0, 10).forEach(function (i) { checked.add(i); });
  trs.forEach(function (tr, i) { tr._box.checked = checked.has(i); });
  drawCurves();
}
best.addEventListener('click', tickBest);
applyFilter();
if (hash.get('sort')) sortBy(hash.get('sort'), hash.get('order') !== 'asc');

// ---- sections the plots fill in
function section(title, id) {
  document.body.appendChild(el('h2', null, title));
  var div = el('div', {id: id}); document.body.appendChild(div); return div;
}
var curvesDiv = section('Learning curves of the ticked runs', 'curves-section');
var curveKeys = [];
D.curves.forEach(function (c) { if (c) Object.keys(c).forEach(function (k) { if (curveKeys.indexOf(k) < 0) curveKeys.push(k); }); });
var curveSel = el('select', {id: 'curve-metric'});
curveKeys.forEach(function (k) { curveSel.appendChild(el('option', {value: k}, k)); });
curvesDiv.appendChild(el('div', {'class': 'controls'})).append(el('span', null, 'curve:'), curveSel);
var curvesPlot = el('div', {id: 'curves', 'class': 'plot'}); curvesDiv.appendChild(curvesPlot);
curveSel.addEventListener('change', drawCurves);

var groupsDiv = section('Groups by config: mean and 95% interval (the statistics compare reports)', 'groups-section');
var gMetric = el('select', {id: 'group-metric'}), gBy = el('select', {id: 'group-by'});
Object.keys(D.groups).forEach(function (m) { gMetric.appendChild(el('option', {value: m}, m)); });
groupsDiv.appendChild(el('div', {'class': 'controls'})).append(el('span', null, 'metric:'), gMetric, el('span', null, 'group by:'), gBy);
var groupsPlot = el('div', {id: 'groups', 'class': 'plot'}); groupsDiv.appendChild(groupsPlot);
var groupsTable = el('table', {id: 'group-table'}); groupsDiv.appendChild(groupsTable);
function fillGroupBy() {
  gBy.textContent = '';
  Object.keys(D.groups[gMetric.value] || {}).forEach(function (w) {
    gBy.appendChild(el('option', {value: w}, w === 'config' ? 'the whole config (as compare groups)' : w));
  });
}
gMetric.addEventListener('change', function () { fillGroupBy(); drawGroups(); });
gBy.addEventListener('change', drawGroups);

var diffDiv = section('Config diff of two runs', 'diff-section');
var dA = el('select', {id: 'diff-a'}), dB = el('select', {id: 'diff-b'});
rows.forEach(function (r, i) { dA.appendChild(el('option', {value: i}, r[nameAt])); dB.appendChild(el('option', {value: i}, r[nameAt])); });
if (rows.length > 1) dB.value = '1';
diffDiv.appendChild(el('div', {'class': 'controls'})).append(el('span', null, 'A:'), dA, el('span', null, 'B:'), dB);
var diffTable = el('table', {id: 'diff'}); diffDiv.appendChild(diffTable);
function drawDiff() {
  diffTable.textContent = '';
  var a = +dA.value, b = +dB.value, n = 0, head = el('tr');
  head.append(el('th', null, 'key'), el('th', null, 'A'), el('th', null, 'B'));
  diffTable.appendChild(head);
  D.diff.keys.forEach(function (k, j) {
    var va = D.diff.values[a] ? D.diff.values[a][j] : null, vb = D.diff.values[b] ? D.diff.values[b][j] : null;
    if (va === vb) return;
    var tr = el('tr'); tr.append(el('td', null, k), el('td', null, va === null ? '(absent)' : va), el('td', null, vb === null ? '(absent)' : vb));
    diffTable.appendChild(tr); n++;
  });
  if (!n) diffTable.appendChild(el('tr')).appendChild(el('td', {colspan: 3}, 'no config key differs'));
}
dA.addEventListener('change', drawDiff); dB.addEventListener('change', drawDiff); drawDiff();

var sweepDiv = section('Sweeps: parameter importance and parallel coordinates', 'sweep-section');
var sSel = el('select', {id: 'sweep'});
D.sweeps.forEach(function (s, i) { sSel.appendChild(el('option', {value: i}, s.name)); });
sweepDiv.appendChild(el('div', {'class': 'controls'})).append(el('span', null, 'sweep:'), sSel);
var how = el('p', {'class': 'small'}); sweepDiv.appendChild(how);
var impPlot = el('div', {id: 'importance'}), parPlot = el('div', {id: 'parallel', 'class': 'plot'});
sweepDiv.append(impPlot, parPlot);
sSel.addEventListener('change', drawSweep);
if (!D.sweeps.length) how.textContent = 'no sweep with two finished jobs here';

// ---- plots (after Plotly is unpacked)
var PLOT_CONFIG = {displaylogo: false, responsive: true};
function drawCurves() {
  if (!window.Plotly) return;
  var key = curveSel.value, traces = [];
  checked.forEach(function (i) {
    var c = D.curves[i] && D.curves[i][key];
    if (!c) return;
    traces.push({type: 'scatter', mode: 'lines+markers', name: esc(rows[i][nameAt]),
      x: c.map(function (p) { return p[0]; }), y: c.map(function (p) { return p[1]; })});
  });
  Plotly.react(curvesPlot, traces, {margin: {t: 20}, xaxis: {title: {text: 'epoch'}},
    yaxis: {title: {text: esc(key)}}, showlegend: true}, PLOT_CONFIG);
}
function drawGroups() {
  groupsTable.textContent = '';
  var m = gMetric.value, gs = (D.groups[m] || {})[gBy.value] || [];
  var head = el('tr');
  ['group', 'n', 'mean', '95% interval', 'runs'].forEach(function (h) { head.appendChild(el('th', null, h)); });
  groupsTable.appendChild(head);
  gs.forEach(function (g, i) {
    var tr = el('tr');
    tr.append(el('td', null, 'g' + (i + 1) + '  ' + g.label), el('td', {'class': 'num'}, g.n),
      el('td', {'class': 'num'}, fmt(g.mean, 'num')),
      el('td', {'class': 'num'}, g.low === null ? '(one run)' : fmt(g.low, 'num') + ' \u2013 ' + fmt(g.high, 'num')),
      el('td', {title: g.runs.join('\n')}, g.runs.length + ' run' + (g.runs.length > 1 ? 's' : '')));
    groupsTable.appendChild(tr);
  });
  if (!window.Plotly) return;
  var shownGroups = gs.slice(0, 40);
  Plotly.react(groupsPlot, [{type: 'bar',
    x: shownGroups.map(function (g, i) { return 'g' + (i + 1); }),
    y: shownGroups.map(function (g) { return g.mean; }),
    hovertext: shownGroups.map(function (g) { return esc(g.label) + ' (n=' + g.n + ')'; }),
    error_y: {type: 'data', symmetric: false,
      array: shownGroups.map(function (g) { return g.high === null ? 0 : g.high - g.mean; }),
      arrayminus: shownGroups.map(function (g) { return g.low === null ? 0 : g.mean - g.low; })}}],
    {margin: {t: 20}, yaxis: {title: {text: esc(m)}}}, PLOT_CONFIG);
}
function drawSweep() {
  var s = D.sweeps[+sSel.value];
  if (!s || !window.Plotly) return;
  how.textContent = 'importance: ' + s.how + '; ' + s.rows.length + ' finished jobs';
  Plotly.react(impPlot, [{type: 'bar', orientation: 'h',
    y: s.importance.map(function (p) { return esc(p[0]); }), x: s.importance.map(function (p) { return p[1]; })}],
    {margin: {t: 20, l: 160}, height: 110 + 40 * s.importance.length, xaxis: {title: {text: 'importance'}}, yaxis: {autorange: 'reversed'}}, PLOT_CONFIG);
  var dims = s.keys.map(function (k, j) {
    var vals = s.rows.map(function (r) { return r[j]; });
    if (vals.every(function (v) { return typeof v === 'number'; })) return {label: esc(k), values: vals};
    var labels = Array.from(new Set(vals.map(String))).sort();
    return {label: esc(k), values: vals.map(function (v) { return labels.indexOf(String(v)); }),
      tickvals: labels.map(function (l, i) { return i; }), ticktext: labels.map(esc)};
  });
  var last = s.rows.map(function (r) { return r[r.length - 1]; });
  dims.push({label: esc(s.metric), values: last});
  Plotly.react(parPlot, [{type: 'parcoords', dimensions: dims, line: {color: last, showscale: true}}],
    {margin: {t: 40, l: 60, r: 60}}, PLOT_CONFIG);
}
async function loadPlotly() {
  var b64 = document.getElementById('plotly-gz').textContent.trim();
  var bin = Uint8Array.from(atob(b64), function (c) { return c.charCodeAt(0); });
  var stream = new Blob([bin]).stream().pipeThrough(new DecompressionStream('gzip'));
  document.head.appendChild(el('script', null, await new Response(stream).text()));
}
fillGroupBy();
drawGroups();
if (rows.length) tickBest();
loadPlotly().then(function () {
  drawCurves(); drawGroups(); drawSweep(); document.body.dataset.ready = '1';
}).catch(function (e) {
  document.body.dataset.plotly = 'plots unavailable: ' + e;
  document.body.dataset.ready = '1';
  document.body.insertBefore(el('p', {'class': 'meta'}, 'The plots could not be drawn: ' + e), document.body.children[2]);
});
})();
"""
