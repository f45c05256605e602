/*
 * page.js - draws the page chorus-trace --html writes (embedded in it; no
 * network). Reads the JSON of <script id="trace-data">:
 *   ranks[]  {r, name, sub, where, dump, culprit, tdump,
 *             calls [[start, end, label, title, open]],
 *             steps [[start, end, label, title, stuck]],
 *             marks [[t, "fault"|"verdict", title]]}
 *   arrows[] [from, t_send, to, t_recv, title]      messages
 *   waits[]  [from, to, t, title, hot]              wait-for edges
 * times in milliseconds from the earliest event, on rank 0's clock.
 * Draws one lane per rank (collectives above, steps below), message arrows
 * between lanes, stuck steps and the culprit's lane in red, and the
 * wait-for graph; then adds #trace-ok (or #trace-error and rethrows).
 */
(function () {
  'use strict';
  var NS = 'http://www.w3.org/2000/svg';
  var LANE = 66, LABEL_W = 210, TOP = 24, ROWS = 4;
  var D = null, zoom = 1;

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c];
    });
  }

  function fmt(ms) {
    var a = Math.abs(ms);
    if (a >= 1000) return (ms / 1000).toFixed(a >= 10000 ? 1 : 2) + ' s';
    if (a >= 1) return ms.toFixed(a >= 100 ? 0 : 1) + ' ms';
    return (ms * 1000).toFixed(0) + ' us';
  }

  function niceStep(raw) {
    if (!(raw > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log(raw) / Math.LN10)), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
  }

  /* Gives each interval a sub-row (at most ROWS); returns how many rows. */
  function pack(items) {
    var ends = [];
    items.forEach(function (it) {
      var row = -1, i;
      for (i = 0; i < ends.length; i++) if (ends[i] <= it[0]) { row = i; break; }
      if (row < 0) {
        if (ends.length < ROWS) { row = ends.length; ends.push(0); }
        else { row = 0; for (i = 1; i < ends.length; i++) if (ends[i] < ends[row]) row = i; }
      }
      ends[row] = Math.max(ends[row], it[1]);
      it.row = row;
    });
    return Math.max(ends.length, 1);
  }

  function rect(cls, x, y, w, h, title) {
    return '<rect class="' + cls + '" x="' + x.toFixed(1) + '" y="' + y.toFixed(1) + '" width="' +
      Math.max(1, w).toFixed(1) + '" height="' + h.toFixed(1) + '"><title>' + esc(title) +
      '</title></rect>';
  }

  function timeline() {
    var host = document.getElementById('timeline');
    var avail = Math.max(600, (host.clientWidth || 1000) - LABEL_W - 4);
    var W = Math.round(avail * zoom), span = Math.max(D.span, 0.001);
    var k = (W - 40) / span;
    var x = function (t) { return 10 + Math.max(0, Math.min(span, t)) * k; };
    var H = TOP + D.ranks.length * LANE + 4, laneY = {}, lab = [], svg = [];
    lab.push('<svg xmlns="' + NS + '" width="' + LABEL_W + '" height="' + H + '">');
    svg.push('<svg xmlns="' + NS + '" width="' + W + '" height="' + H + '">');
    svg.push('<defs>' +
      '<marker id="ah" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" ' +
      'orient="auto"><path d="M0,0L10,5L0,10z" fill="#4b5563"/></marker>' +
      '<marker id="ahr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" ' +
      'orient="auto"><path d="M0,0L10,5L0,10z" fill="#dc2626"/></marker></defs>');
    var st = niceStep(span / Math.max(2, W / 110)), t;
    svg.push('<g class="axis">');
    lab.push('<text x="8" y="15" fill="#6b7280">rank</text>');
    for (t = 0; t <= span + st / 2; t += st) {
      svg.push('<line x1="' + x(t) + '" y1="' + (TOP - 4) + '" x2="' + x(t) + '" y2="' + H + '"/>' +
        '<text x="' + (x(t) + 2) + '" y="14">' + fmt(t) + '</text>');
    }
    svg.push('</g>');
    D.ranks.forEach(function (R, i) {
      var y = TOP + i * LANE;
      laneY[R.r] = y;
      var cls = 'lane' + (R.culprit ? ' culprit' : '') + (R.dump ? '' : ' missing');
      lab.push('<g class="' + cls + '" data-rank="' + R.r + '"><title>' + esc(R.where) + '</title>' +
        '<rect class="lane-bg" x="0" y="' + y + '" width="' + LABEL_W + '" height="' + LANE + '"/>' +
        '<text class="lane-label" x="8" y="' + (y + 18) + '">' + esc(R.name) + '</text>' +
        '<text x="8" y="' + (y + 34) + '" fill="#4b5563">' + esc(R.sub) + '</text>' +
        '<text x="8" y="' + (y + 50) + '" fill="#6b7280">' + esc(R.where.slice(0, 34)) +
        '</text></g>');
      svg.push('<g class="' + cls + '" data-rank="' + R.r + '">' +
        '<rect class="lane-bg" x="0" y="' + y + '" width="' + W + '" height="' + LANE + '"/>');
      if (!R.dump) {
        svg.push('<text class="lane-label" x="' + (x(0) + 8) + '" y="' + (y + LANE / 2 + 4) +
          '">no dump' + (R.culprit ? ': this rank is the culprit' : '') + '</text>');
      }
      R.calls.forEach(function (c) {
        var x0 = x(c[0]), w = x(c[1]) - x0;
        svg.push(rect('call' + (c[4] ? ' open' : ''), x0, y + 5, w, 20, c[3]));
        if (w > 46) {
          svg.push('<text x="' + (x0 + 3) + '" y="' + (y + 19) + '" pointer-events="none">' +
            esc(c[2].slice(0, Math.floor(w / 6.5))) + '</text>');
        }
      });
      var steps = R.steps.slice().sort(function (a, b) { return a[0] - b[0]; });
      var rows = pack(steps), hh = 30 / rows;
      steps.forEach(function (s) {
        var x0 = x(s[0]);
        svg.push(rect('step' + (s[4] ? ' stuck' : ''), x0, y + 30 + s.row * hh, x(s[1]) - x0,
          hh - 1, s[3]));
      });
      R.marks.forEach(function (m) {
        var mx = x(m[0]);
        if (m[1] === 'fault') {
          svg.push('<path class="fault" d="M' + (mx - 5) + ',' + (y + 2) + 'L' + (mx + 5) + ',' +
            (y + 2) + 'L' + mx + ',' + (y + 11) + 'z"><title>' + esc(m[2]) + '</title></path>');
        } else {
          svg.push('<path class="verdict" d="M' + mx + ',' + (y + 2) + 'L' + (mx + 5) + ',' +
            (y + 7) + 'L' + mx + ',' + (y + 12) + 'L' + (mx - 5) + ',' + (y + 7) +
            'z"><title>' + esc(m[2]) + '</title></path>');
        }
      });
      if (R.tdump !== null) {
        svg.push('<line class="dumpline" x1="' + x(R.tdump) + '" y1="' + y + '" x2="' +
          x(R.tdump) + '" y2="' + (y + LANE) + '"><title>dump written</title></line>');
      }
      svg.push('</g>');
    });
    D.arrows.forEach(function (a) {
      if (laneY[a[0]] === undefined || laneY[a[2]] === undefined) return;
      svg.push('<line class="msg" marker-end="url(#ah)" x1="' + x(a[1]) + '" y1="' +
        (laneY[a[0]] + 45) + '" x2="' + x(a[3]) + '" y2="' + (laneY[a[2]] + 45) + '"><title>' +
        esc(a[4]) + '</title></line>');
    });
    D.waits.forEach(function (w) {
      if (laneY[w[0]] === undefined || laneY[w[1]] === undefined) return;
      var wx = x(w[2]) - 6, y0 = laneY[w[0]] + LANE / 2, y1 = laneY[w[1]] + LANE / 2;
      var bend = 24 + Math.min(120, Math.abs(y1 - y0) / 4);
      svg.push('<path class="wait" marker-end="url(#ahr)" d="M' + wx + ',' + y0 + 'C' +
        (wx - bend) + ',' + y0 + ' ' + (wx - bend) + ',' + y1 + ' ' + wx + ',' + y1 +
        '"><title>' + esc(w[3]) + '</title></path>');
    });
    svg.push('</svg>');
    lab.push('</svg>');
    host.innerHTML = '<div class="tl"><div class="labels">' + lab.join('') +
      '</div><div class="scroll" id="tl-scroll">' + svg.join('') + '</div></div>';
  }

  function graph() {
    var host = document.getElementById('graph');
    var nodes = [], seen = {};
    function add(r) { if (!seen.hasOwnProperty(r)) { seen[r] = nodes.length; nodes.push(r); } }
    if (D.size <= 16) D.ranks.forEach(function (R) { add(R.r); });
    if (D.culprit >= 0) add(D.culprit);
    D.waits.forEach(function (w) { if (nodes.length < 64) { add(w[0]); add(w[1]); } });
    if (!nodes.length) { host.innerHTML = '<p>No rank waits on another.</p>'; return; }
    var byRank = {};
    D.ranks.forEach(function (R) { byRank[R.r] = R; });
    var n = nodes.length, rad = Math.max(70, n * 14), cx = rad + 60, cy = rad + 40, pos = [];
    nodes.forEach(function (r, i) {
      var a = -Math.PI / 2 + 2 * Math.PI * i / n;
      pos.push(n === 1 ? [cx, cy] : [cx + rad * Math.cos(a), cy + rad * Math.sin(a)]);
    });
    var s = ['<svg xmlns="' + NS + '" width="' + (2 * cx) + '" height="' + (2 * cy) + '">',
      '<defs><marker id="gah" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" ' +
      'markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#4b5563"/></marker>' +
      '<marker id="gahr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" ' +
      'markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" fill="#dc2626"/></marker></defs>'];
    D.waits.forEach(function (w) {
      if (!seen.hasOwnProperty(w[0]) || !seen.hasOwnProperty(w[1])) return;
      var p = pos[seen[w[0]]], q = pos[seen[w[1]]], dx = q[0] - p[0], dy = q[1] - p[1];
      var len = Math.sqrt(dx * dx + dy * dy) || 1, ux = dx / len, uy = dy / len;
      s.push('<line class="edge' + (w[4] ? ' hot' : '') + '" marker-end="url(#' +
        (w[4] ? 'gahr' : 'gah') + ')" x1="' + (p[0] + ux * 20) + '" y1="' + (p[1] + uy * 20) +
        '" x2="' + (q[0] - ux * 22) + '" y2="' + (q[1] - uy * 22) + '"><title>' + esc(w[3]) +
        '</title></line>');
    });
    nodes.forEach(function (r, i) {
      var R = byRank[r], p = pos[i];
      var cls = 'node' + (r === D.culprit ? ' culprit' : '') + (R && !R.dump ? ' missing' : '');
      s.push('<g class="' + cls + '" data-rank="' + r + '"><title>' +
        esc('rank ' + r + ': ' + (R ? R.where : '')) + '</title><circle cx="' + p[0] +
        '" cy="' + p[1] + '" r="18"/><text class="lbl" x="' + p[0] + '" y="' + (p[1] + 4) +
        '">' + r + '</text></g>');
    });
    s.push('</svg>');
    host.innerHTML = s.join('');
  }

  function setZoom(z, keep) {
    var sc = document.getElementById('tl-scroll');
    var frac = sc && sc.scrollWidth ? (sc.scrollLeft + (keep || 0)) / sc.scrollWidth : 0;
    zoom = Math.max(1, Math.min(4096, z));
    timeline();
    sc = document.getElementById('tl-scroll');
    if (sc) sc.scrollLeft = frac * sc.scrollWidth - (keep || 0);
  }

  function main() {
    D = JSON.parse(document.getElementById('trace-data').textContent);
    timeline();
    graph();
    document.getElementById('zoom-in').addEventListener('click', function () { setZoom(zoom * 2); });
    document.getElementById('zoom-out').addEventListener('click', function () { setZoom(zoom / 2); });
    document.getElementById('zoom-fit').addEventListener('click', function () { setZoom(1); });
    document.getElementById('zoom-end').addEventListener('click', function () {
      setZoom(8);
      var sc = document.getElementById('tl-scroll');
      if (sc) sc.scrollLeft = sc.scrollWidth;
    });
    document.getElementById('timeline').addEventListener('wheel', function (e) {
      if (!e.ctrlKey) return;
      e.preventDefault();
      var sc = document.getElementById('tl-scroll');
      var off = sc ? e.clientX - sc.getBoundingClientRect().left : 0;
      setZoom(e.deltaY < 0 ? zoom * 1.25 : zoom / 1.25, off);
    }, { passive: false });
    var ok = document.createElement('div');
    ok.id = 'trace-ok';
    ok.className = 'ok';
    ok.textContent = 'drawn: ' + D.ranks.length + ' lanes, ' + D.arrows.length + ' messages, ' +
      D.waits.length + ' waits' + (D.hidden ? ', ' + D.hidden + ' lanes not drawn' : '');
    document.getElementById('footer').appendChild(ok);
  }

  try {
    main();
  } catch (e) {
    var el = document.createElement('div');
    el.id = 'trace-error';
    el.className = 'error';
    el.textContent = 'the timeline could not be drawn: ' + e;
    document.body.insertBefore(el, document.body.firstChild);
    throw e;
  }
})();
