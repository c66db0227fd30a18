// Narrow windows (a phone): the section links fold behind the top bar's Menu button.
(function () {
  const button = document.getElementById("nav-toggle");
  if (!button) return;
  const bar = button.closest(".topbar");
  button.addEventListener("click", () => {
    const open = bar.classList.toggle("nav-open");
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });
})();
