"""charts/gpushare's admission webhook: on by default; on, only our pods reach it, its settings parse as
share-webhook parses them, its RBAC names only its own objects."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from share_core.contract import SCHEDULER_NAME
from tests.unit.chart import helm as h

Obj = dict[str, Any]
ON = {"webhook.enabled": True}
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
NAMES_DEFAULT = (
    "(!has(object.spec.schedulerName) || object.spec.schedulerName == '' || "
    "object.spec.schedulerName == 'default-scheduler')"
)


def test_on_by_default_and_off_by_value(helm: Any) -> None:
    """On by default (samples/ name no scheduler); webhook.enabled=false leaves nothing of it (NOTES then
    tell the user to write schedulerName: test_chart.py's test_helm_install_dry_run_and_notes)."""
    docs = h.render_chart()
    assert h.one(docs, "MutatingWebhookConfiguration") and h.one(docs, "ValidatingWebhookConfiguration")
    off = h.render_chart(set_values={"webhook.enabled": False})
    assert not h.objects(off, "MutatingWebhookConfiguration") and not h.objects(off, "ValidatingWebhookConfiguration")
    assert not [d for d in off if "webhook" in d["metadata"]["name"]]
    assert "webhook" not in yaml.safe_load(h.one(off, "ConfigMap", "gpushare-config")["data"]["config.yaml"])


def test_on_two_replicas_a_pdb_and_a_service(helm: Any) -> None:
    from share_webhook.cli import build_parser

    docs = h.render_chart(set_values=ON)
    dep = h.component(docs, "Deployment", "webhook")
    assert dep["spec"]["replicas"] == 2
    assert h.component(docs, "PodDisruptionBudget", "webhook")["spec"]["maxUnavailable"] == 1
    svc = h.component(docs, "Service", "webhook")
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    args = h.program_args(docs, dep, "webhook", build_parser())
    assert (args.port, args.service, args.cert_secret) == (9443, "gpushare-webhook", "gpushare-webhook-tls")
    assert args.mutating_config == args.validating_config == "gpushare-webhook" and not args.tls_cert_file
    c = h.container(dep, "webhook")
    assert c["ports"][0]["containerPort"] == args.port
    assert c["securityContext"]["readOnlyRootFilesystem"] is True, "the certificate goes to the /tmp emptyDir"
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c["env"]


def test_only_pods_asking_gpu_mem_reach_it_failing_closed(helm: Any) -> None:
    docs = h.render_chart(set_values=ON)
    mutating = h.one(docs, "MutatingWebhookConfiguration")
    validating = h.one(docs, "ValidatingWebhookConfiguration")
    assert [w["name"] for w in mutating["webhooks"]] == ["scheduler.gpushare.io"]
    for hook, path in ((mutating["webhooks"][0], "/mutate"), (validating["webhooks"][0], "/validate")):
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["clientConfig"]["service"] == {"name": "gpushare-webhook", "namespace": "gpushare-system",
                                                   "port": 443, "path": path}  # fmt: skip
        assert hook["rules"] == [
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
             "scope": "Namespaced"}
        ]  # fmt: skip
        (cond,) = hook["matchConditions"]
        assert "'nvidia.com/gpu-mem' in c.resources.limits" in cond["expression"]
        assert "object.spec.initContainers.exists" in cond["expression"]
    # the mutation is asked only for pods naming no scheduler; validation judges (and warns) them all
    assert mutating["webhooks"][0]["matchConditions"][0]["expression"].startswith(NAMES_DEFAULT + " && (")
    assert "schedulerName" not in validating["webhooks"][0]["matchConditions"][0]["expression"]
    ignore = h.render_chart(set_values={**ON, "webhook.failurePolicy": "Ignore"})
    assert h.one(ignore, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Ignore"


def test_scheduler_set_by_policy_where_the_cluster_serves_it(helm: Any) -> None:
    """mutation auto: a MutatingAdmissionPolicy where the cluster serves v1 (1.36+), the webhook elsewhere; the
    policy matches what the webhook's /mutate would be sent, and sets what /mutate would."""
    by_webhook = h.render_chart(set_values=ON, kube_version="v1.35.0")
    served = h.render_chart(set_values=ON, kube_version="v1.37.2", api_versions=(MAP_API,))
    assert not h.objects(by_webhook, "MutatingAdmissionPolicy")
    hook_cond = h.one(by_webhook, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"][0]
    policy = h.one(served, "MutatingAdmissionPolicy", "gpushare-webhook-scheduler")["spec"]
    assert policy["matchConditions"] == [hook_cond]
    assert policy["failurePolicy"] == "Fail" and policy["reinvocationPolicy"] == "Never"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    (mutation,) = policy["mutations"]
    patch = f"[JSONPatch{{op: 'add', path: '/spec/schedulerName', value: '{SCHEDULER_NAME}'}}]"
    assert mutation == {"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}
    binding = h.one(served, "MutatingAdmissionPolicyBinding", "gpushare-webhook-scheduler")["spec"]
    assert binding == {"policyName": "gpushare-webhook-scheduler"}
    # the MutatingWebhookConfiguration stays (it owns the certificate Secret), without the scheduler's hook
    assert not h.one(served, "MutatingWebhookConfiguration").get("webhooks")
    assert h.one(served, "ValidatingWebhookConfiguration")["webhooks"][0]["name"] == "request.gpushare.io"
    forced = h.render_chart(set_values={**ON, "webhook.mutation": "webhook"}, api_versions=(MAP_API,))
    assert not h.objects(forced, "MutatingAdmissionPolicy")
    assert h.one(forced, "MutatingWebhookConfiguration")["webhooks"][0]["name"] == "scheduler.gpushare.io"
    with pytest.raises(h.HelmError, match=r"needs admissionregistration\.k8s\.io/v1 MutatingAdmissionPolicy"):
        h.render_chart(set_values={**ON, "webhook.mutation": "policy"}, kube_version="v1.35.0")
    with pytest.raises(h.HelmError, match="mutation"):
        h.render_chart(set_values={**ON, "webhook.mutation": "cel"})


def test_opted_in_namespaces_fail_open(helm: Any) -> None:
    docs = h.render_chart(set_values={**ON, "webhook.scheduleNamespaces.enabled": True})
    hooks = h.one(docs, "MutatingWebhookConfiguration")["webhooks"]
    ns = hooks[1]
    assert ns["name"] == "namespace-scheduler.gpushare.io" and ns["failurePolicy"] == "Ignore"
    assert ns["namespaceSelector"] == {"matchLabels": {"gpushare.io/schedule": "all"}}
    assert ns["clientConfig"]["service"]["path"] == "/mutate-all"
    assert ns["matchConditions"][0]["expression"].startswith("!(")


def test_rbac_names_only_its_own_objects(helm: Any) -> None:
    docs = h.render_chart(set_values=ON)
    rules = h.one(docs, "ClusterRole", "gpushare-webhook")["rules"]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]} in rules
    configs = next(r for r in rules if r["apiGroups"] == ["admissionregistration.k8s.io"])
    assert configs["resourceNames"] == ["gpushare-webhook"] and configs["verbs"] == ["get", "patch"]
    role = h.one(docs, "Role", "gpushare-webhook")["rules"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpushare-webhook-tls"],
            "verbs": ["get", "update"]} in role  # fmt: skip


def test_cert_manager_owns_the_certificate_when_asked(helm: Any) -> None:
    from share_webhook.cli import build_parser

    with pytest.raises(h.HelmError, match="needs cert-manager"):
        h.render_chart(set_values={**ON, "webhook.certManager.enabled": True})
    docs = h.render_chart(set_values={**ON, "webhook.certManager.enabled": True}, api_versions=["cert-manager.io/v1"])
    cert = h.one(docs, "Certificate")
    assert cert["spec"]["secretName"] == "gpushare-webhook-tls"
    assert "gpushare-webhook.gpushare-system.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"name": "gpushare-webhook", "kind": "Issuer"} and h.one(docs, "Issuer")
    inject = "gpushare-system/gpushare-webhook"
    assert (
        h.one(docs, "MutatingWebhookConfiguration")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == inject
    )
    dep = h.component(docs, "Deployment", "webhook")
    args = h.program_args(docs, dep, "webhook", build_parser())
    assert args.tls_cert_file == "/etc/gpushare-webhook-tls/tls.crt" and not args.mutating_config
    assert not h.objects(docs, "Role") or all(
        r["metadata"]["name"] != "gpushare-webhook" for r in h.objects(docs, "Role")
    )
