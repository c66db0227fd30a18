"""Forms for engine runtimes and launch profiles.

The launch-profile form's clean() builds the LaunchSpec and asks the engine
plugin (check_spec, which also validates the extra arguments) so that each
problem is shown next to its own field.
"""
import json
import shlex

from django import forms
from django.utils.translation import gettext_lazy as _

from inference.deployments.services import profile_problems
from inference.engines import InvalidLaunch, parse_extra_args
from inference.models import EngineRuntime, LaunchProfile, ModelArtifact

TRISTATE = (("", _("engine default")), ("on", _("on")), ("off", _("off")))



def speculative_config_from(value) -> dict:
    """The speculative-config field's JSON text as a dict, or a message saying what is wrong."""
    if isinstance(value, dict):
        return value
    text = (value or "").strip()
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise forms.ValidationError(_("not valid JSON (%(error)s at character %(pos)s)") % {"error": exc.msg, "pos": exc.pos}) from None
    if not isinstance(data, dict):
        raise forms.ValidationError(_('a JSON object such as {"method": "dflash", "model": "…"}'))
    return data

class RuntimeForm(forms.ModelForm):
    class Meta:
        model = EngineRuntime
        fields = ["name", "engine", "kind", "path", "image"]
        labels = {"name": _("Name"), "engine": _("Engine"), "kind": _("Kind"), "path": _("Path"), "image": _("Image")}
        help_texts = {"path": _("the executable (vllm, llama-server, …) or the virtualenv folder"),
                      "image": _("for Docker: e.g. vllm/vllm-openai:v0.11.0")}


class LaunchProfileForm(forms.ModelForm):
    gpus = forms.CharField(required=False, label="GPUs", help_text=_("indexes such as 0,1 (→ CUDA_VISIBLE_DEVICES); "
                                                                     "empty = CPU only"))
    enable_prefix_caching = forms.ChoiceField(choices=TRISTATE, required=False, label=_("Prefix caching"))
    speculative_config = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                                         label=_("Speculative config"),
                                         help_text=_('JSON, e.g. {"method": "dflash", "model": "…", '
                                                     '"num_speculative_tokens": 15}'))
    env = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), label=_("Environment variables"),
                          help_text=_("one NAME=value per line"))
    extra_args = forms.CharField(required=False, label=_("Extra arguments"),
                                 help_text=_("more engine flags, e.g. --enforce-eager; checked against the engine’s "
                                             "known flags"))
    model = forms.ModelChoiceField(queryset=ModelArtifact.objects.filter(status=ModelArtifact.Status.READY),
                                   required=False, label=_("Model (downloaded)"))

    class Meta:
        model = LaunchProfile
        fields = ["name", "runtime", "model", "model_path", "served_model_name", "gpus", "tensor_parallel_size",
                  "dtype", "quantization", "max_model_len", "gpu_memory_utilization", "swap_space_gb",
                  "cpu_offload_gb", "kv_cache_dtype", "attention_backend", "enable_prefix_caching",
                  "max_num_seqs", "speculative_config", "bind_host", "port", "api_key", "env", "extra_args",
                  "trust_remote_code"]
        labels = {"name": _("Name"), "runtime": _("Runtime"), "served_model_name": _("Served model name"),
                  "tensor_parallel_size": _("Tensor parallel size"), "dtype": "dtype",
                  "quantization": _("Quantization"), "max_model_len": _("Max model length"),
                  "attention_backend": _("Attention backend"), "trust_remote_code": _("Trust remote code"),
                  "model_path": _("Model path or repo id"), "bind_host": _("Listen address"),
                  "port": _("Port"), "api_key": _("API key"), "swap_space_gb": _("Swap space (GiB)"),
                  "cpu_offload_gb": _("CPU offload (GiB)"), "max_num_seqs": _("Max concurrent sequences"),
                  "gpu_memory_utilization": _("GPU memory utilization"), "kv_cache_dtype": _("KV cache dtype")}
        help_texts = {"model_path": _("filled from the chosen model; or a path on the host"),
                      "bind_host": _("127.0.0.1 keeps the engine private to this machine"),
                      "port": _("empty = pick a free one at launch")}
        widgets = {"api_key": forms.PasswordInput(render_value=True)}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model_path"].required = False
        inst = self.instance
        if inst and inst.pk and not self.is_bound:
            self.initial["gpus"] = ",".join(str(g) for g in inst.gpus or [])
            self.initial["enable_prefix_caching"] = {True: "on", False: "off"}.get(inst.enable_prefix_caching, "")
            self.initial["speculative_config"] = json.dumps(inst.speculative_config) if inst.speculative_config else ""
            self.initial["env"] = "\n".join(f"{k}={v}" for k, v in (inst.env or {}).items())
            self.initial["extra_args"] = " ".join(shlex.quote(a) for a in inst.extra_args or [])

    def clean_gpus(self):
        text = (self.cleaned_data.get("gpus") or "").replace(" ", "")
        if not text:
            return []
        try:
            return [int(x) for x in text.split(",") if x != ""]
        except ValueError:
            raise forms.ValidationError(_("GPUs are indexes separated by commas, such as 0,1")) from None

    def clean_enable_prefix_caching(self):
        return {"on": True, "off": False}.get(self.cleaned_data.get("enable_prefix_caching") or "")

    def clean_speculative_config(self):
        return speculative_config_from(self.cleaned_data.get("speculative_config"))

    def clean_env(self):
        out = {}
        for n, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip():
                continue
            if "=" not in line:
                raise forms.ValidationError(_("line %(n)s: write NAME=value") % {"n": n})
            k, v = line.split("=", 1)
            out[k.strip()] = v
        return out

    def clean_extra_args(self):
        try:
            return parse_extra_args(self.cleaned_data.get("extra_args") or "")
        except InvalidLaunch as exc:
            raise forms.ValidationError(exc.problems["extra_args"]) from None

    def clean(self):
        data = super().clean()
        model = data.get("model")
        if model and not data.get("model_path"):
            data["model_path"] = model.path
            self.instance.model_path = model.path
        if not data.get("model_path") and "model_path" not in self.errors:
            self.add_error("model_path", _("choose a downloaded model or give a path on the host"))
        runtime = data.get("runtime")
        if runtime is None or self.errors:
            return data
        profile = self._profile(data)
        for field, message in profile_problems(profile).items():
            self.add_error(field if field in self.fields else None, message)
        return data

    def _profile(self, data):
        values = {k: v for k, v in data.items() if k in {f.name for f in LaunchProfile._meta.fields}}
        profile = LaunchProfile(**{**values, "host": data["runtime"].host})
        if self.instance.pk:
            profile.pk = self.instance.pk
        return profile

    def profile(self):
        """An unsaved LaunchProfile of the cleaned values (for the preview)."""
        return self._profile(self.cleaned_data)
