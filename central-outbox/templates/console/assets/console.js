// Live refresh: every few seconds, fetch this same page again and swap in the fresh copy of each
// element marked data-live (tiles, site health, the list). Forms are never replaced, so a filter
// being typed is not lost. The header tells central this is a refresh, which does not count as
// the operator using the session (an open tab does not keep a session alive), and pauses while
// the tab is hidden. Without JavaScript the pages simply do not refresh by themselves.
(function () {
  "use strict";
  var EVERY_MS = 3000;
  if (!document.querySelector("[data-live]")) { return; }
  function refresh() {
    if (document.hidden) { return; }
    fetch(window.location.href, { credentials: "same-origin", headers: { "x-console-refresh": "1" } })
      .then(function (response) {
        // A redirect (to /login) or an error page: leave the page as it is.
        if (!response.ok || response.redirected) { return null; }
        return response.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live][id]").forEach(function (old) {
          var replacement = fresh.getElementById(old.id);
          if (replacement) { old.replaceWith(document.importNode(replacement, true)); }
        });
      })
      .catch(function () { /* central unreachable for a moment: try again next time */ });
  }
  window.setInterval(refresh, EVERY_MS);
})();
