/* django-debounce admin: live countdowns for open windows (no framework).
 *
 * Every <time class="debounce-countdown" datetime="ISO deadline" data-now="ISO server time">
 * shows "in 4 m 12 s" (or "due now", "overdue by 3 s"); the server renders the first text, so
 * the page works without JavaScript. The server's clock is the reference: the offset between
 * data-now and the browser's clock at load is applied, so a skewed browser clock shows the
 * same countdown. The format matches django_debounce.admin.helpers.format_countdown.
 */
"use strict";
(function () {
  var UNITS = [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]];

  function format(seconds) {
    var whole = seconds >= 0 ? Math.floor(seconds) : -Math.floor(-seconds);
    if (whole === 0) {
      return "due now";
    }
    var left = Math.abs(whole);
    var parts = [];
    for (var i = 0; i < UNITS.length && parts.length < 2; i++) {
      var size = UNITS[i][0];
      if (left >= size || parts.length) {
        parts.push(Math.floor(left / size) + " " + UNITS[i][1]);
        left = left % size;
      }
    }
    return (whole > 0 ? "in " : "overdue by ") + parts.join(" ");
  }

  var clocks = [];

  function collect() {
    var loaded = Date.now();
    document.querySelectorAll("time.debounce-countdown[datetime]").forEach(function (el) {
      var deadline = Date.parse(el.getAttribute("datetime"));
      var serverNow = Date.parse(el.getAttribute("data-now"));
      if (isNaN(deadline)) {
        return;
      }
      clocks.push({el: el, deadline: deadline, skew: isNaN(serverNow) ? 0 : serverNow - loaded});
    });
  }

  function tick() {
    var now = Date.now();
    clocks.forEach(function (c) {
      var seconds = (c.deadline - (now + c.skew)) / 1000;
      c.el.textContent = format(seconds);
      c.el.classList.toggle("debounce-due", seconds < 1);
    });
  }

  function start() {
    collect();
    if (clocks.length) {
      tick();
      window.setInterval(tick, 1000);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
