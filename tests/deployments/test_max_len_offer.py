"""When vLLM says "the estimated maximum model length is N", the deployment page
shows N and offers to relaunch with it; the relaunch sets the profile's max model len."""
from django.conf import settings
from django.test import Client

from inference.deployments import services
from inference.deployments.supervisor import Observation, WatchState, watch_step
from inference.engines import get_engine
from inference.models import Deployment, EngineRuntime, LaunchProfile

LINE = ("(EngineCore pid=4) ERROR [core.py:708] ValueError: To serve at least one request with the models's max "
        "seq len (262144), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(5.12 GiB). Based on the available memory, the estimated maximum model length is 83,840. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")


def failed_deployment():
    state = WatchState(started_at=0.0)
    watch_step(state, Observation(running=True, new_lines=(LINE,)), 1.0, get_engine("vllm"))
    watch_step(state, Observation(running=False), 2.0, get_engine("vllm"))
    assert state.status == "failed"
    runtime = EngineRuntime.objects.create(host=settings.HOST_NAME, name="vllm", engine="vllm", kind="venv",
                                           path="/opt/vllm", version="0.32.0+cpu")
    profile = LaunchProfile.objects.create(name="big context", host=settings.HOST_NAME, runtime=runtime,
                                           model_path="/models/m", max_model_len=262144)
    return Deployment.objects.create(name=profile.name, host=settings.HOST_NAME, profile=profile, engine_name="vllm",
                                     status="failed", failure=state.failure, hint=state.hint,
                                     watch_state=state.to_dict())


def test_the_page_offers_the_estimate_and_the_relaunch_uses_it(db, operator, viewer, monkeypatch):
    sent = []
    monkeypatch.setattr(services.jobs, "enqueue", lambda task, pk, **kw: sent.append(pk))
    dep = failed_deployment()
    client = Client()
    client.force_login(viewer)
    assert "83840" in client.get(f"/deployments/{dep.pk}/").content.decode()
    client.force_login(operator)
    page = client.get(f"/deployments/{dep.pk}/").content.decode()
    assert 'id="max-len-offer"' in page and "Relaunch with max model len 83840" in page
    r = client.post(f"/deployments/{dep.pk}/relaunch-max-len", {"max_model_len": "83840"})
    new = Deployment.objects.exclude(pk=dep.pk).get()
    assert r.status_code == 302 and r["Location"] == f"/deployments/{new.pk}/"
    assert new.profile.max_model_len == 83840 and new.status == "pending" and sent == [new.pk]


def test_a_bad_value_is_refused_and_loses_nothing(db, operator):
    dep = failed_deployment()
    client = Client()
    client.force_login(operator)
    for bad in ("lots", "3", ""):
        r = client.post(f"/deployments/{dep.pk}/relaunch-max-len", {"max_model_len": bad})
        assert r.status_code == 302 and r["Location"] == f"/deployments/{dep.pk}/"
    assert Deployment.objects.count() == 1 and LaunchProfile.objects.get().max_model_len == 262144
