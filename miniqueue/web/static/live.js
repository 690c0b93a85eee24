// Live updates: every [data-live] region re-fetches its fragment (the page's URL with
// ?partial=1) every few seconds. The user can pause it; the choice is remembered. A region is
// left alone while the user has ticked a checkbox or focused a control inside it, so a refresh
// never throws away a selection in progress. Hidden tabs do not poll, and a slow fragment (a
// big table's counts) is polled less often: the wait is at least ten times the slowest fetch of
// the last round, so an open dashboard keeps the database busy a tenth of the time at most.
(function () {
  "use strict";
  var button = document.getElementById("live-toggle");
  var status = document.getElementById("live-status");
  var regions = Array.prototype.slice.call(document.querySelectorAll("[data-live]")).filter(function (r) {
    return r.getAttribute("data-live");
  });
  var key = "miniqueue.live.paused";
  var paused = window.localStorage.getItem(key) === "1";
  var interval = button ? (parseInt(button.getAttribute("data-interval"), 10) || 2000) : 2000;
  var slowest = 0;  // ms, the slowest fetch of the current round

  function show(text) {
    if (status) { status.textContent = text; }
  }

  function render() {
    if (!button) { return; }
    button.textContent = paused ? "Resume live updates" : "Pause live updates";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    show(paused ? "paused" : "live");
  }

  function busy(region) {
    return region.querySelector("input[type=checkbox]:checked") !== null ||
      (document.activeElement !== document.body && region.contains(document.activeElement));
  }

  function refresh(region) {
    if (busy(region)) { return Promise.resolve(); }
    var started = Date.now();
    return fetch(region.getAttribute("data-live"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        slowest = Math.max(slowest, Date.now() - started);
        if (!busy(region)) { region.innerHTML = html; }
        show(paused ? "paused" : "updated " + new Date().toLocaleTimeString());
      })
      .catch(function (error) { show("update failed: " + error.message); });
  }

  function tick() {
    slowest = 0;
    var done = (!paused && !document.hidden) ? Promise.all(regions.map(refresh)) : Promise.resolve();
    done.then(function () { window.setTimeout(tick, Math.max(interval, 10 * slowest)); });
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target && target.id === "select-all") {
      document.querySelectorAll("input[name=ids]").forEach(function (box) { box.checked = target.checked; });
    }
  });

  if (button && regions.length) {
    button.addEventListener("click", function () {
      paused = !paused;
      window.localStorage.setItem(key, paused ? "1" : "0");
      render();
    });
    render();
    window.setTimeout(tick, interval);
  }
})();
