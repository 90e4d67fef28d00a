"""Rollout latency on SmolLM2: from the ``challenger`` alias being set to the first request
the challenger answers, and to its promotion, with zero bake time.

Everything real: MLflow, tritonserver, tansu and the gateway as its own process;
SmolLM2-135M-Instruct is the champion, a LoRA adapter on it (made by PEFT, not
trained: serving cost is the same) the challenger. A client calls the gateway
throughout. The controller ticks every 0.2 s, as `spanmill rollout` would with
SPANMILL_ROLLOUT_INTERVAL_S=0.2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from spanmill.config import MLflowSettings, RolloutSettings, TritonSettings
from spanmill.models import pull_model
from spanmill.registry import CHALLENGER, CHAMPION, Lineage, ModelRegistry
from spanmill.rollout.service import build_reconciler
from spanmill.stack.ports import free_port
from spanmill.stack.process import wait_until
from spanmill.stack.services import KafkaBroker, MLflowServer, TritonServer

AGENT = "calculator"


def lora_adapter(base: Path, folder: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    projections = ["q_proj", "k_proj", "v_proj", "o_proj"]
    config = LoraConfig(r=16, lora_alpha=32, target_modules=projections, task_type="CAUSAL_LM")
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    base = pull_model("smollm2-135m")
    adapter = lora_adapter(base, work / "adapter")
    repository = work / "repo"
    broker = KafkaBroker("127.0.0.1", free_port(), work / "kafka").start()
    mlflow = MLflowServer("127.0.0.1", free_port(), work / "mlflow").start()
    triton = TritonServer(
        "127.0.0.1", work / "triton", repository,
        http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
    ).start()  # fmt: skip
    routes = work / "routes.json"
    port = free_port()
    env = dict(os.environ, SPANMILL_KAFKA_BOOTSTRAP_SERVERS=broker.url,
               SPANMILL_TRITON_HTTP_URL=triton.url)  # fmt: skip
    gateway = subprocess.Popen(
        [sys.executable, "-m", "spanmill.cli.main", "gateway", "--port", str(port),
         "--routing-file", str(routes)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, timeout=60,
                   what="gateway")  # fmt: skip
        settings = RolloutSettings(
            mlflow=MLflowSettings(tracking_uri=mlflow.url),
            triton=TritonSettings(http_url=triton.url, model_repository=str(repository)),
            agents=[AGENT], steps=[5, 25, 50, 100], bake_s=0, min_requests=1, grace_s=0,
            state_file=work / "rollout-state.json", routing_file=routes, gateway_urls=[url],
            num_threads=1,
        )  # fmt: skip
        reconciler = build_reconciler(settings)
        registry = ModelRegistry(mlflow.url)
        champion = registry.register(AGENT, Lineage(kind="base", base_model=str(base))).version
        registry.promote(AGENT, champion)
        started = time.perf_counter()
        while not routes.exists():
            reconciler.tick()
        print(f"champion SmolLM2 in service (write, load, smoke check): "
              f"{time.perf_counter() - started:.1f}s", flush=True)  # fmt: skip

        challenger = registry.register(
            AGENT, Lineage(kind="adapter", base_model=str(base)), adapter
        ).version
        first_answer: list[float] = []
        answered: list[float] = []

        def traffic() -> None:
            body = {"model": AGENT, "messages": [{"role": "user", "content": "2 + 3?"}],
                    "max_tokens": 4}  # fmt: skip
            with httpx.Client(base_url=url, timeout=120) as client:
                while not stop.is_set():
                    response = client.post("/v1/chat/completions", json=body)
                    answered.append(time.perf_counter())
                    version = response.headers.get("x-spanmill-model-version")
                    if version == str(challenger) and not first_answer:
                        first_answer.append(time.perf_counter())

        client = threading.Thread(target=traffic, daemon=True)
        client.start()
        aliased = time.perf_counter()
        registry.set_alias(AGENT, CHALLENGER, challenger)
        promoted = None
        deploy_s = None
        while promoted is None:
            for decision in reconciler.tick():
                if decision.action == "deploy" and deploy_s is None:
                    deploy_s = time.perf_counter() - aliased
                if decision.action == "promote":
                    promoted = time.perf_counter()
            if time.perf_counter() - aliased > 600:
                raise RuntimeError("no promotion within 10 minutes")
            time.sleep(0.2)
        assert registry.aliases(AGENT)[CHAMPION] == challenger
        print(f"challenger alias set -> deployed and answering its smoke check: {deploy_s:.1f}s")
        if first_answer:
            print(f"challenger alias set -> first request answered by the challenger: "
                  f"{first_answer[0] - aliased:.1f}s")  # fmt: skip
        print(f"challenger alias set -> promoted (4 steps, zero bake): {promoted - aliased:.1f}s",
              flush=True)  # fmt: skip
        during = [t for t in answered if aliased <= t <= promoted]
        # A step is judged once the challenger answered min_requests (1) of its share: at
        # 5% that takes about 20 requests, so the client's rate bounds the canary's pace.
        print(f"client: {len(during)} requests during the rollout, "
              f"{len(during) / (promoted - aliased):.1f}/s, one at a time")  # fmt: skip
    finally:
        stop.set()
        gateway.terminate()
        gateway.wait(timeout=30)
        triton.stop()
        mlflow.stop()
        broker.stop()


if __name__ == "__main__":
    main()
