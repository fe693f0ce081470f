// retryd dead-letter explorer: the only script the pages load (no build step, no library).
// It polls a replay job's progress while the job runs; every page works without it.
(function () {
  "use strict";

  function csrfToken() {
    var field = document.querySelector('input[name="csrf"]');
    return field ? field.value : "";
  }

  function setText(id, value) {
    var el = document.getElementById(id);
    if (el && value !== undefined && value !== null) {
      el.textContent = String(value);
    }
  }

  function pollJob(section) {
    var jobId = section.getAttribute("data-job");
    var url = "/ui/jobs/" + encodeURIComponent(jobId) + "/progress";
    var timer = null;

    function update(p) {
      setText("job-state", p.state);
      setText("job-replayed", p.replayed);
      setText("job-to-replay", p.to_replay);
      setText("job-skipped", p.skipped);
      setText("job-skip-reasons", p.skip_reasons || "none");
      setText("job-rate", p.rate);
      setText("job-errors", p.errors);
      setText("job-detail", p.stop_reason || p.detail);
      if (p.finished) {
        section.setAttribute("data-finished", "true");
        var cancel = document.getElementById("cancel-job");
        if (cancel) {
          cancel.hidden = true;
        }
        if (timer !== null) {
          window.clearInterval(timer);
          timer = null;
        }
      }
    }

    function tick() {
      fetch(url, {
        credentials: "same-origin",
        headers: { "Accept": "application/json", "X-CSRF-Token": csrfToken() }
      })
        .then(function (resp) {
          if (resp.status === 401) {
            window.location.assign("/ui/login?expired=1&next=" + encodeURIComponent(window.location.pathname));
            return null;
          }
          return resp.ok ? resp.json() : null;
        })
        .then(function (p) {
          if (p) {
            update(p);
          }
        })
        .catch(function () { /* try again on the next tick */ });
    }

    if (section.getAttribute("data-finished") !== "true") {
      timer = window.setInterval(tick, 1000);
      tick();
    }
  }

  function selectAll(box) {
    box.addEventListener("change", function () {
      var boxes = document.querySelectorAll("input.select-record");
      for (var i = 0; i < boxes.length; i++) {
        boxes[i].checked = box.checked;
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var section = document.getElementById("job");
    if (section) {
      pollJob(section);
    }
    var all = document.getElementById("select-all");
    if (all) {
      selectAll(all);
    }
  });
})();
