// Plan a launch: nothing is submitted from this page; every change goes to the
// live preflight panel. Choosing a preset fills in its launch values.
(function () {
  const form = document.getElementById("plan-form");
  form.addEventListener("submit", (ev) => ev.preventDefault());
  const presets = JSON.parse(document.getElementById("preset-values").textContent);
  // choosing a preset fills in its launch values, as its one-click launch would use them
  function applyPreset(slug) {
    const p = presets[slug];
    if (!p) return;
    ["tensor_parallel_size", "dtype", "quantization", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype",
     "attention_backend", "max_num_seqs"].forEach((k) => { form.elements[k].value = p[k] ?? ""; });
    form.elements.speculative_config.value = p.speculative_config ? JSON.stringify(p.speculative_config) : "";
    if (form.elements.engine.value !== p.engine) {   // the planned engine follows the preset
      form.elements.engine.value = p.engine;
      form.elements.engine_version.value = "";
    }
  }
  // Picked by the user, a preset also sets the hardware it is made for (2× V100 for the
  // tensor-parallel one) and the sm70 build; on load the page already shows them.
  form.elements.preset.addEventListener("change", (e) => {
    applyPreset(e.target.value);
    const p = presets[e.target.value];
    if (!p) return;
    if (p.target) form.elements.target.value = p.target;
    form.elements.sm70_build.checked = !!p.sm70_build;
  });
  applyPreset(form.elements.preset.value);
  window.planPreflight = KilnPreflight.attach(form, { panel: "preflight-panel" });
})();
