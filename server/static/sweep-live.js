// Live progress on the sweep page without reloading it: fetch the page's changing part every
// few seconds while the sweep is building or running, and swap it in only when it changed (so
// a text selection survives until there is something new to show).
(function () {
  "use strict";
  var box = document.getElementById("sweep-live");
  if (!box) return;
  var last = box.innerHTML;
  var period = 2000;

  function poll() {
    if (box.getAttribute("data-live") !== "yes") return;
    fetch(box.getAttribute("data-live-url"), { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("status " + response.status);
        return response.text();
      })
      .then(function (html) {
        if (html !== last) {
          box.innerHTML = html;
          last = html;
        }
        var state = box.querySelector("#sweep-state");
        var ended = state && ["completed", "failed"].indexOf(state.getAttribute("data-state")) >= 0;
        if (ended) box.setAttribute("data-live", "no");
        else window.setTimeout(poll, period);
      })
      .catch(function () { window.setTimeout(poll, period * 3); });
  }
  window.setTimeout(poll, period);
})();
