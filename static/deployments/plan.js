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
  form.elements.preset.addEventListener("change", (e) => applyPreset(e.target.value));
  applyPreset(form.elements.preset.value);
  window.planPreflight = KilnPreflight.attach(form, { panel: "preflight-panel" });
})();
