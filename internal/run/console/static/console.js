// intentd review console: the live parts, on server-sent events fed by
// intentd's Watch. Everything works without this script; it only keeps the
// queue count current and says when an open intent changed.
"use strict";
(function () {
  var count = document.getElementById("live-count");
  if (count && window.EventSource) {
    var status = document.getElementById("live-status");
    var shown = null;
    var es = new EventSource(count.getAttribute("data-live"));
    es.addEventListener("count", function (e) {
      var d = JSON.parse(e.data);
      var text = d.count + (d.capped ? "+" : "");
      count.textContent = text;
      count.setAttribute("aria-label", text + " intents waiting");
      if (status) {
        if (shown !== null && shown !== text) {
          status.textContent = "The queue changed: " + text + " waiting now. ";
          var a = document.createElement("a");
          a.href = "";
          a.textContent = "Reload the list";
          status.appendChild(a);
        }
        if (shown === null) shown = text;
      }
    });
    es.onerror = function () { count.textContent = "?"; count.setAttribute("aria-label", "live count unavailable"); };
  }

  var changed = document.getElementById("intent-changed");
  if (changed && window.EventSource) {
    var token = document.querySelector("input[name=expected_token]");
    var ws = new EventSource(changed.getAttribute("data-watch"));
    ws.addEventListener("intent", function (e) {
      var d = JSON.parse(e.data);
      var state = document.getElementById("intent-state");
      if ((state && d.state !== state.textContent.trim()) || (token && d.token !== token.value)) {
        changed.hidden = false;
      }
    });
  }

  // Show only the decide form's fields that the chosen decision uses.
  var form = document.querySelector("section.decide form");
  if (form) {
    var sync = function () {
      var c = form.querySelector("input[name=decision]:checked");
      var v = c ? c.value : "";
      form.querySelector(".if-completed").hidden = v !== "completed";
      form.querySelector(".if-failed").hidden = v !== "failed";
    };
    form.addEventListener("change", sync);
    sync();
  }

  // The tenant switch goes to the tenant's queue.
  var sw = document.querySelector("form[data-tenant-switch]");
  if (sw) {
    sw.addEventListener("submit", function (e) {
      e.preventDefault();
      var t = sw.querySelector("[name=tenant]").value.trim();
      if (t) window.location.href = "/console/t/" + encodeURIComponent(t) + "/queue";
    });
  }
})();
