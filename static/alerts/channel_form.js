// Channel form: show the webhook URL for chat channels and the SMTP fields for email.
(function () {
  "use strict";
  var kind = document.getElementById("id_kind");
  if (!kind) return;
  function sync() {
    document.querySelectorAll("#channel-form [data-kinds]").forEach(function (el) {
      el.hidden = el.getAttribute("data-kinds").split(" ").indexOf(kind.value) < 0;
    });
  }
  kind.addEventListener("change", sync);
  sync();
})();
