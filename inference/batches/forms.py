"""The Batches page's form: input (upload or paste), deployment, concurrency, pacing."""

from django import forms
from django.utils.translation import gettext_lazy as _

from inference.batches.services import DEFAULT_CONCURRENCY, MAX_CONCURRENCY, MAX_PACING_MS
from inference.batches.validate import ENDPOINTS


class BatchForm(forms.Form):
    text = forms.CharField(label=_("…or paste JSONL"), required=False, widget=forms.Textarea(attrs={"rows": 6}))
    endpoint = forms.ChoiceField(label=_("Endpoint"), choices=[(e, e) for e in ENDPOINTS])
    deployment = forms.TypedChoiceField(label=_("Deployment"), coerce=int)
    concurrency = forms.IntegerField(
        label=_("Concurrency"), initial=DEFAULT_CONCURRENCY, min_value=1, max_value=MAX_CONCURRENCY,
        help_text=_("Requests at once. Keep it low on old cards: a flooded V100 runs out of memory."))
    pacing_ms = forms.IntegerField(label=_("Pacing (ms between requests)"), initial=0, min_value=0,
                                   max_value=MAX_PACING_MS, required=False)

    def __init__(self, *args, deployments=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["deployment"].choices = [(d.pk, f"{d.name} ({d.served_model_name})") for d in deployments]
