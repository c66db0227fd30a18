"""Forms of the experiment pages (the service checks what depends on the rows)."""
from django import forms
from django.utils.translation import gettext_lazy as _

from inference.benchmarks.scenarios import SCENARIOS
from inference.models import Deployment, Experiment, LaunchProfile

GOODPUT_HELP = _("e.g. ttft:500 tpot:50 e2el:5000, as vllm bench serve --goodput takes them; a request counts "
                 "when it meets every SLO given. Empty: TPOT ≤ 1000 / the per-stream SLO, if one is set.")
ORDER_CHOICES = [("", _("Automatic (interleaved when the GPUs allow, otherwise A, B, A, B blocks)"))] + [
    (value, label) for value, label in Experiment.Order.choices]


def configuration_choices():
    """'p<id>' for a launch profile (the experiment launches it), 'd<id>' for a ready deployment."""
    profiles = [(f"p{p.pk}", f"{p.name} · {p.host}") for p in LaunchProfile.objects.order_by("name")]
    ready = [(f"d{d.pk}", f"{d.name} #{d.pk} · {d.host}:{d.port}")
             for d in Deployment.objects.filter(status=Deployment.Status.READY).order_by("name")]
    return [("", "—"), (_("Launch profiles (launched and stopped by the experiment)"), profiles),
            (_("Running deployments (measured as they are)"), ready)]


def parse_configuration(value: str) -> dict | None:
    if not value:
        return None
    kind, number = value[:1], value[1:]
    if kind not in ("p", "d") or not number.isdigit():
        return None
    return {"profile" if kind == "p" else "deployment": int(number)}


class ExperimentForm(forms.Form):
    name = forms.CharField(label=_("Name"), required=False, max_length=200)
    config_a = forms.ChoiceField(label=_("A (baseline)"))
    label_a = forms.CharField(label=_("Label of A"), required=False, max_length=40)
    config_b = forms.ChoiceField(label=_("B"), required=False)
    label_b = forms.CharField(label=_("Label of B"), required=False, max_length=40)
    config_c = forms.ChoiceField(label=_("C (optional)"), required=False)
    label_c = forms.CharField(label=_("Label of C"), required=False, max_length=40)
    scenario = forms.ChoiceField(label=_("Workload"), choices=[(s.name, _(s.title)) for s in SCENARIOS.values()])
    concurrency_levels = forms.CharField(label=_("Concurrency levels"), required=False,
                                         help_text=_("e.g. 1,4,16; empty = the workload's own"))
    prompt_lengths = forms.CharField(label=_("Prompt lengths (tokens)"), required=False,
                                     help_text=_("e.g. 512,2048,8192 for TTFT vs prompt length"))
    repetitions = forms.IntegerField(label=_("Repetitions"), min_value=1, max_value=20, initial=3)
    order = forms.ChoiceField(label=_("Order"), choices=ORDER_CHOICES, required=False)
    num_prompts = forms.IntegerField(label=_("Prompts per run"), required=False, min_value=1, max_value=10000)
    output_tokens = forms.IntegerField(label=_("Output tokens"), required=False, min_value=1, max_value=100000)
    slo_decode_tok_s = forms.FloatField(label=_("Per-stream SLO (tok/s)"), required=False, min_value=0.001)
    goodput = forms.CharField(label=_("Goodput SLOs (ms)"), required=False, max_length=200, help_text=GOODPUT_HELP)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        choices = configuration_choices()
        for name in ("config_a", "config_b", "config_c"):
            self.fields[name].choices = choices

    def configurations(self) -> list[dict]:
        out = []
        for letter in "abc":
            config = parse_configuration(self.cleaned_data.get(f"config_{letter}") or "")
            if config:
                config["label"] = self.cleaned_data.get(f"label_{letter}") or ""
                out.append(config)
        return out

    def overrides(self) -> dict:
        return {k: self.cleaned_data.get(k) for k in ("num_prompts", "output_tokens")
                if self.cleaned_data.get(k) is not None}


class PresetForm(forms.Form):
    preset = forms.ChoiceField(choices=[("speculative", "speculative"), ("sweet-spot", "sweet-spot")])
    configuration = forms.ChoiceField(label=_("Configuration"))
    slo_decode_tok_s = forms.FloatField(label=_("Per-stream SLO (tok/s)"), required=False, min_value=0.001)
    goodput = forms.CharField(label=_("Goodput SLOs (ms)"), required=False, max_length=200, help_text=GOODPUT_HELP)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["configuration"].choices = configuration_choices()
