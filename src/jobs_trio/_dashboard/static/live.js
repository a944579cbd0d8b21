// The dashboard's one script (jobs_trio/_dashboard/static/live.js), served from the dashboard
// itself (its CSP allows no other, and no inline script). Every data-refresh seconds it fetches
// a fresh copy of the page it is on and swaps in each part marked data-live, leaving the rest
// as it is: a filter being typed keeps its text, a ticked job stays ticked (where the job is
// still listed). A part holding the focus is left for the next round. Without this script the
// page reloads itself (a meta refresh in <noscript>). It also ticks "all" on the job list and
// asks before an action on every job a filter matches.
(function () {
  "use strict";

  function ticked(root) {
    var ids = new Set();
    root.querySelectorAll("input[name=job]:checked").forEach(function (box) {
      ids.add(box.value);
    });
    return ids;
  }

  function swap(fresh) {
    var kept = ticked(document);
    document.querySelectorAll("[data-live][id]").forEach(function (part) {
      if (part.contains(document.activeElement) && document.activeElement !== document.body) {
        return; // in use: the next round brings it
      }
      var replacement = fresh.getElementById(part.id);
      if (replacement === null) {
        return;
      }
      var adopted = document.importNode(replacement, true);
      adopted.querySelectorAll("input[name=job]").forEach(function (box) {
        box.checked = kept.has(box.value);
      });
      part.replaceWith(adopted);
    });
    // Parts the fresh page has and this one had not (a list that was empty) come with a
    // reload of the page's own: rare, and the next round sees them.
    var at = document.getElementById("live-at");
    if (at !== null) {
      at.textContent = " (updated " + new Date().toLocaleTimeString() + ")";
    }
    document.documentElement.dataset.liveUpdates =
      String(Number(document.documentElement.dataset.liveUpdates || "0") + 1);
  }

  function update(every) {
    window.setTimeout(function () {
      if (document.hidden) {
        update(every); // a tab in the background asks nothing of the database
        return;
      }
      // A request the server never answers (its database stalled under it, a proxy holding
      // the connection) would hold this round, and every later one behind it, for good: the
      // page would stop updating until reloaded. Cut at twice the period (2 s at least); the
      // next round asks again, and the "updated" time says how old the page is meanwhile.
      var cut = new AbortController();
      var timer = window.setTimeout(function () {
        cut.abort();
      }, Math.max(2 * every, 2) * 1000);
      window
        .fetch(window.location.href, {
          credentials: "same-origin",
          cache: "no-store",
          signal: cut.signal,
        })
        .then(function (answer) {
          return answer.ok ? answer.text() : null;
        })
        .then(function (text) {
          if (text !== null) {
            swap(new DOMParser().parseFromString(text, "text/html"));
          }
        })
        .catch(function () {}) // the dashboard is away, or cut: the next round tries again
        .then(function () {
          window.clearTimeout(timer);
          update(every);
        });
    }, every * 1000);
  }

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box instanceof HTMLInputElement && box.id === "select-all") {
      document.querySelectorAll("input[name=job]").forEach(function (one) {
        one.checked = box.checked;
      });
    }
  });

  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) {
      event.preventDefault();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var every = Number(document.body.dataset.refresh || "0");
    if (every > 0) {
      update(every);
    }
  });
})();
