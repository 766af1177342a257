// Live parts of a page: each element with data-live="URL" is refreshed every
// data-every milliseconds with the HTML fragment the server renders at URL (escaped
// there like the page itself). No inline script, no build step, no library.
"use strict";
(function () {
  function refresh(element) {
    if (document.hidden) {
      return;  // a background tab costs the database nothing
    }
    fetch(element.dataset.live, {
      credentials: "same-origin",
      headers: {"X-Live": "1"},
      cache: "no-store",
    })
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (html) {
        // a <details> the reader opened (a traceback) stays open across the refresh
        var open = Array.prototype.map.call(
          element.querySelectorAll("details[open][id]"), function (d) { return d.id; });
        element.innerHTML = html;
        open.forEach(function (id) {
          var again = document.getElementById(id);
          if (again) {
            again.open = true;
          }
        });
        element.removeAttribute("data-stale");
        element.dataset.refreshes = String((Number(element.dataset.refreshes) || 0) + 1);
      })
      .catch(function () {
        // logged out, the server gone, the database slow: keep the last view, marked
        element.setAttribute("data-stale", "");
      });
  }
  document.querySelectorAll("[data-live]").forEach(function (element) {
    var every = Math.max(500, Number(element.dataset.every) || 2000);
    window.setInterval(function () { refresh(element); }, every);
  });
})();
