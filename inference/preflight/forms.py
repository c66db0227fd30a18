"""The preflight request: the launch form's fields plus what to check them against.

It accepts the same field names as the launch-profile form (runtime, model, gpus,
tensor_parallel_size, dtype, ...), so the panel can post that form as it is, and a
few of its own: preset (a preset's model instead of a downloaded one), engine +
engine_version + sm70_build (planning without a registered runtime) and target
(a planning target instead of the host's own GPUs). Fields it does not know
(name, port, api_key, ...) are ignored.
"""

from django import forms
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from inference.deployments import presets
from inference.deployments.forms import speculative_config_from
from inference.engines import InvalidLaunch, parse_extra_args
from inference.models import EngineRuntime, ModelArtifact
from inference.preflight.services import PLANNING_TARGETS

DTYPES = ("auto", "half", "float16", "fp16", "bfloat16", "bf16", "float32", "float")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "f16", "bf16", "f32", "q8_0", "q5_1", "q5_0",
             "q4_1", "q4_0", "iq4_nl", "float16", "bfloat16")


class PreflightForm(forms.Form):
    runtime = forms.ModelChoiceField(queryset=EngineRuntime.objects.all(), required=False,
                                     error_messages={"invalid_choice": gettext_lazy("no such runtime; pick one from the list")})
    engine = forms.ChoiceField(choices=[("", "—")] + list(EngineRuntime.Engine.choices), required=False)
    engine_version = forms.CharField(required=False, max_length=100)
    sm70_build = forms.BooleanField(required=False)
    model = forms.ModelChoiceField(queryset=ModelArtifact.objects.all(), required=False,
                                   error_messages={"invalid_choice": gettext_lazy("no such model; pick one from the list")})
    preset = forms.ChoiceField(choices=[("", "—")] + [(p.slug, p.name) for p in presets.PRESETS], required=False)
    target = forms.ChoiceField(choices=[("", gettext_lazy("this host's GPUs"))] + [(t.slug, t.label) for t in PLANNING_TARGETS],
                               required=False)
    gpus = forms.CharField(required=False)
    tensor_parallel_size = forms.IntegerField(required=False, min_value=1, max_value=64)
    dtype = forms.CharField(required=False, max_length=20)
    quantization = forms.CharField(required=False, max_length=50)
    max_model_len = forms.IntegerField(required=False, min_value=1, max_value=10_000_000)
    gpu_memory_utilization = forms.FloatField(required=False, min_value=0.05, max_value=1.0)
    kv_cache_dtype = forms.CharField(required=False, max_length=20)
    attention_backend = forms.CharField(required=False, max_length=50)
    max_num_seqs = forms.IntegerField(required=False, min_value=1, max_value=100_000)
    speculative_config = forms.CharField(required=False)
    extra_args = forms.CharField(required=False)

    def clean_gpus(self):
        text = (self.cleaned_data.get("gpus") or "").replace(" ", "")
        if not text:
            return []
        try:
            return [int(x) for x in text.split(",") if x != ""]
        except ValueError:
            raise forms.ValidationError(_("GPUs are indexes separated by commas, such as 0,1")) from None

    def clean_dtype(self):
        value = (self.cleaned_data.get("dtype") or "").strip().lower()
        if value and value not in DTYPES:
            raise forms.ValidationError(_("unknown dtype %(value)r; use auto, half, bfloat16 or float32") % {"value": value})
        return value

    def clean_kv_cache_dtype(self):
        value = (self.cleaned_data.get("kv_cache_dtype") or "").strip().lower()
        if value and value not in KV_DTYPES:
            raise forms.ValidationError(_("unknown KV cache dtype %(value)r; use auto or fp8 (vLLM), "
                                          "f16, q8_0 or q4_0 (llama.cpp)") % {"value": value})
        return value

    def clean_speculative_config(self):
        return speculative_config_from(self.cleaned_data.get("speculative_config"))

    def clean_extra_args(self):
        try:
            return parse_extra_args(self.cleaned_data.get("extra_args") or "")
        except InvalidLaunch as exc:
            raise forms.ValidationError(exc.problems["extra_args"]) from None

    def clean(self):
        data = super().clean()
        if not data.get("runtime") and not data.get("engine") and not data.get("preset") and not self.errors:
            self.add_error("runtime", _("choose a runtime, or an engine to plan with"))
        return data


def form_errors(form) -> dict:
    """{"field": "message", ...}; errors not tied to a field are under "__all__"."""
    return {field: " ".join(str(m) for m in messages) for field, messages in form.errors.items()}
