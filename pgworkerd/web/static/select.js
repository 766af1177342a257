// The jobs list's "select every job of this page" box. No inline script.
"use strict";
(function () {
  var all = document.getElementById("select-all");
  if (!all) {
    return;
  }
  all.addEventListener("change", function () {
    document.querySelectorAll("input.select").forEach(function (box) {
      box.checked = all.checked;
    });
  });
})();
