// ledger status page: local times, countdowns and (when served) refresh in place.
// No inline handlers, no eval, no request but the page's own refresh URL on its own origin.
(function () {
  "use strict";
  var body = document.body;
  var docNow = Date.parse(body.getAttribute("data-now") || "");
  var loadedAt = Date.now();
  var refreshUrl = body.getAttribute("data-refresh");
  var refreshMs = 1000 * (parseInt(body.getAttribute("data-refresh-seconds") || "5", 10) || 5);
  // ISO-like 24-hour local time with its UTC offset: 2026-12-01 17:48:29 +09:00
  function localTime(date) {
    var off = -date.getTimezoneOffset(), sign = off < 0 ? "-" : "+";
    off = Math.abs(off);
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds()) + " " +
      sign + pad(Math.floor(off / 60)) + ":" + pad(off % 60);
  }

  // the ledger's clock as the page knows it: the document's time plus what passed since
  function ledgerNow() {
    return isNaN(docNow) ? Date.now() : docNow + (Date.now() - loadedAt);
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  // the one duration format of the CLI, the page and simulate (ledger.durations.human_duration_ms):
  // the largest unit and the one below it, no spaces: 1h5m, 4m9s, 12s (whole seconds, rounded up)
  var UNITS = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  function left(ms) {
    var total = Math.max(0, Math.ceil(ms / 1000));
    if (!total) { return "0s"; }
    for (var i = 0; i < UNITS.length; i++) {
      if (total >= UNITS[i][1]) {
        var text = Math.floor(total / UNITS[i][1]) + UNITS[i][0];
        if (i + 1 < UNITS.length) {
          var finer = Math.floor((total % UNITS[i][1]) / UNITS[i + 1][1]);
          if (finer) { text += finer + UNITS[i + 1][0]; }
        }
        return text;
      }
    }
    return total + "s";
  }

  function localTimes(root) {
    var times = root.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var t = Date.parse(times[i].getAttribute("datetime"));
      if (!isNaN(t)) {
        times[i].textContent = localTime(new Date(t));
      }
    }
  }

  function tick() {
    var now = ledgerNow();
    var spans = document.querySelectorAll(".left[data-until]");
    for (var i = 0; i < spans.length; i++) {
      var until = Date.parse(spans[i].getAttribute("data-until"));
      if (isNaN(until)) { continue; }
      var ms = until - now;
      spans[i].textContent = left(ms);
      spans[i].classList.toggle("ended", ms <= 0);
    }
  }

  function refresh() {
    fetch(refreshUrl, { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (resp) {
        if (!resp.ok) { throw new Error("status " + resp.status); }
        return resp.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html");
        var main = fresh.getElementById("status");
        if (!main) { throw new Error("no status in the page"); }
        var x = window.scrollX, y = window.scrollY;
        var focus = focusedPlace();
        var open = {};
        var details = document.querySelectorAll("section[id] details");
        for (var i = 0; i < details.length; i++) { open[details[i].closest("section").id] = details[i].open; }
        document.getElementById("status").replaceWith(document.adoptNode(main));
        for (var id in open) {
          var d = document.querySelector("#" + id + " details");
          if (d) { d.open = open[id]; }
        }
        docNow = Date.parse(fresh.body.getAttribute("data-now") || "");
        loadedAt = Date.now();
        localTimes(document);
        tick();
        window.scrollTo(x, y);
        restoreFocus(focus);
        note("refreshed " + localTime(new Date()));
      })
      .catch(function () { note("refresh failed; showing the last page"); });
  }

  // keyboard focus survives a refresh: the same focusable place in the same section
  var FOCUSABLE = "summary, [tabindex], a[href], button";

  function focusedPlace() {
    var active = document.activeElement;
    var status = document.getElementById("status");
    if (!active || !status || active === status || !status.contains(active)) { return null; }
    var section = active.closest("section[id]");
    var root = section || status;
    var index = Array.prototype.indexOf.call(root.querySelectorAll(FOCUSABLE), active);
    return index < 0 ? null : { section: section ? section.id : null, index: index,
                                scrollLeft: active.scrollLeft };
  }

  function restoreFocus(place) {
    if (!place) { return; }
    var root = place.section ? document.getElementById(place.section) : document.getElementById("status");
    var target = root ? root.querySelectorAll(FOCUSABLE)[place.index] : null;
    if (!target) { return; }
    target.focus({ preventScroll: true });
    target.scrollLeft = place.scrollLeft;
  }

  function note(text) {
    var n = document.getElementById("refresh-note");
    if (n) { n.textContent = text; }
  }

  localTimes(document);
  tick();
  window.setInterval(tick, 1000);
  if (refreshUrl) { window.setInterval(refresh, refreshMs); }
})();
