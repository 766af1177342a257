// The job page's live log tail (pages.job_log_tail, the source `pgworkerd logs -f`
// reads): polls with the cursor the server gave last, appends what is new as text (never
// as HTML), and keeps the view at the end while "follow" is ticked. No inline script.
"use strict";
(function () {
  var element = document.getElementById("log-tail");
  if (!element) {
    return;
  }
  // What the page keeps at most; older output scrolls out (the download has it all).
  var KEEP_CHARS = 2 * 1024 * 1024;
  var follow = document.getElementById("log-follow");
  var attemptLabel = document.getElementById("log-attempt");
  var stateLabel = document.getElementById("log-state");
  var every = Math.max(500, Number(element.dataset.every) || 1000);
  var cursor = {ref: "", head: 0, omitted: 0, tail: 0, tailb: 0, eol: 1};
  var busy = false;

  function url() {
    var query = new URLSearchParams();
    Object.keys(cursor).forEach(function (name) { query.set(name, String(cursor[name])); });
    return element.dataset.tail + "?" + query.toString();
  }

  function append(text) {
    if (!text) {
      return;
    }
    var whole = element.textContent + text;
    if (whole.length > KEEP_CHARS) {
      whole = "[... earlier output not kept on this page ...]\n" + whole.slice(-KEEP_CHARS);
    }
    element.textContent = whole;
    element.dataset.chars = String(whole.length);
  }

  function poll() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    fetch(url(), {credentials: "same-origin", headers: {"X-Live": "1"}, cache: "no-store"})
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.json();
      })
      .then(function (step) {
        element.removeAttribute("data-stale");
        if (step.ref && step.ref !== cursor.ref) {
          if (cursor.ref) {
            append("\n");
          }
          append("--- attempt " + step.attempt + " ---\n");
          attemptLabel.textContent = "attempt " + step.attempt;
        }
        cursor = {ref: step.ref, head: step.head, omitted: step.omitted,
                  tail: step.tail, tailb: step.tailb, eol: step.eol};
        append(step.text);
        stateLabel.textContent = !step.ref ? "no output yet" :
          (step.finished ? "attempt ended" : "running");
        if (follow && follow.checked) {
          element.scrollTop = element.scrollHeight;
        }
        if (step.next) {
          cursor = {ref: "", head: 0, omitted: 0, tail: 0, tailb: 0, eol: 1};
        }
        element.dataset.polls = String((Number(element.dataset.polls) || 0) + 1);
        busy = false;
        if (step.more || step.next) {
          poll();
        }
      })
      .catch(function () {
        element.setAttribute("data-stale", "");
        busy = false;
      });
  }
  poll();
  window.setInterval(poll, every);
})();
