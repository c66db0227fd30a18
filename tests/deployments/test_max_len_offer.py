"""When vLLM says "the estimated maximum model length is N", the deployment page
shows N and offers to relaunch with it; the relaunch sets the profile's max model len.
The line is vLLM's own, from tests/fixtures/vllm_cpu/max_len_estimate.log."""
from django.conf import settings
from django.test import Client

from inference.deployments import services
from inference.deployments.supervisor import Observation, WatchState, watch_step
from inference.engines import get_engine
from inference.models import Deployment, EngineRuntime, LaunchProfile
from tests.helpers import FIXTURES

# A max model len of 4194304 where 1 GiB of KV cache holds 1048576 tokens, less the block vLLM keeps back.
LOG = (FIXTURES / "vllm_cpu" / "max_len_estimate.log").read_text().splitlines()


def failed_deployment():
    state = WatchState(started_at=0.0)
    watch_step(state, Observation(running=True, new_lines=tuple(LOG)), 1.0, get_engine("vllm"))
    watch_step(state, Observation(running=False), 2.0, get_engine("vllm"))
    assert state.status == "failed"
    runtime = EngineRuntime.objects.create(host=settings.HOST_NAME, name="vllm", engine="vllm", kind="venv",
                                           path="/opt/vllm", version="0.32.0+cpu")
    profile = LaunchProfile.objects.create(name="big context", host=settings.HOST_NAME, runtime=runtime,
                                           model_path="/models/m", max_model_len=4194304)
    return Deployment.objects.create(name=profile.name, host=settings.HOST_NAME, profile=profile, engine_name="vllm",
                                     status="failed", failure=state.failure, hint=state.hint,
                                     watch_state=state.to_dict())


def test_the_page_offers_the_estimate_and_the_relaunch_uses_it(db, operator, viewer, monkeypatch):
    sent = []
    monkeypatch.setattr(services.jobs, "enqueue", lambda task, pk, **kw: sent.append(pk))
    dep = failed_deployment()
    client = Client()
    client.force_login(viewer)
    page = client.get(f"/deployments/{dep.pk}/").content.decode()
    assert "holds at most 1048448 tokens per request" in page and 'id="relaunch-max-len"' not in page
    client.force_login(operator)
    page = client.get(f"/deployments/{dep.pk}/").content.decode()
    assert 'id="max-len-offer"' in page and "Relaunch with max model len 1048448" in page
    r = client.post(f"/deployments/{dep.pk}/relaunch-max-len", {"max_model_len": "1048448"})
    new = Deployment.objects.exclude(pk=dep.pk).get()
    assert r.status_code == 302 and r["Location"] == f"/deployments/{new.pk}/"
    assert new.profile.max_model_len == 1048448 and new.status == "pending" and sent == [new.pk]


def test_a_bad_value_is_refused_and_loses_nothing(db, operator):
    dep = failed_deployment()
    client = Client()
    client.force_login(operator)
    for bad in ("lots", "3", ""):
        r = client.post(f"/deployments/{dep.pk}/relaunch-max-len", {"max_model_len": bad})
        assert r.status_code == 302 and r["Location"] == f"/deployments/{dep.pk}/"
    assert Deployment.objects.count() == 1 and LaunchProfile.objects.get().max_model_len == 4194304
