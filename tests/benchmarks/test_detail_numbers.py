"""The run page writes token counts as whole numbers with the language's grouping (issue 17: "330.0")."""
from django.test import Client

from inference.models import BenchmarkRun


def test_server_side_token_counts_are_whole_grouped_numbers(operator):
    run = BenchmarkRun.objects.create(scenario="decode-single-stream", status="succeeded",
                                      snapshot={"server_metrics": {"prompt_tokens": 330.0, "generation_tokens": 12345.0,
                                                                   "prefix_cache_hit_rate": None, "preemptions": None}})
    client = Client()
    client.force_login(operator)
    page = client.get(f"/benchmarks/{run.pk}/").content.decode()
    table = page[page.index('id="server-metrics"'):]
    assert "<td>330</td>" in table and "<td>12,345</td>" in table and "330.0" not in table
