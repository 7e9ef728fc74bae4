#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpus (fuzz/corpus/<target>/seed-*): a handful of small, real
inputs per target, taken from the product's tests, recorded answers and examples. Run it after
changing what a seed should show; the files it writes are committed. Inputs a fuzzer found
(crash-*, regression inputs) are committed beside them and are not written here.

Standard library only: JSON, zlib (SPDY header blocks with the SPDY/3 dictionary, read from the
product's dictionary.rs) and a minimal protobuf encoder (the gRPC backend's answers)."""

import json
import re
import struct
import zlib
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"


def write(target, name, data):
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, (dict, list)):
        data = json.dumps(data, separators=(",", ":")).encode()
    elif isinstance(data, str):
        data = data.encode()
    (folder / f"seed-{name}").write_bytes(data)


UID = "8c3c5f5e-0000-4000-8000-000000000001"


def pod(labels=None, annotations=None, spec=None, status=None, namespace="default"):
    metadata = {"name": "web-0", "namespace": namespace, "uid": UID,
                "labels": labels if labels is not None else {"app": "web"}}
    if annotations:
        metadata["annotations"] = annotations
    value = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
             "spec": spec or {"containers": [{"name": "app", "image": "nginx:1.27"}]}}
    if status:
        value["status"] = status
    return value


# A pod as a Deployment makes it: generateName, owner, defaults the API server filled in.
DEPLOYMENT_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "generateName": "web-7d4b9c8f6d-", "namespace": "default",
        "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d", "alibabacloud.com/eci": "true"},
        "annotations": {"k8s.aliyun.com/eci-use-specs": "2-4Gi"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                             "uid": "0d7f6a52-1111-4000-8000-000000000002", "controller": True,
                             "blockOwnerDeletion": True}],
    },
    "spec": {
        "containers": [{
            "name": "app", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
            "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 5},
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            "volumeMounts": [{"name": "kube-api-access-x2z4p", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        }],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "schedulerName": "default-scheduler",
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": 300}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "volumes": [{"name": "kube-api-access-x2z4p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]}}],
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority", "priority": 0,
    },
}


def review(kind, operation, obj, group="", resource="pods", dry_run=False, name="web-0", old=None):
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": resource},
        "requestKind": {"group": group, "version": "v1", "kind": kind},
        "requestResource": {"group": group, "version": "v1", "resource": resource},
        "name": name, "namespace": "default", "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "uid": "a1b2", "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": obj, "oldObject": old, "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def admission_review():
    write("admission_review", "pod-create-eci-label", review("Pod", "CREATE", pod({"alibabacloud.com/eci": "true"})))
    write("admission_review", "pod-create-plain", review("Pod", "CREATE", pod()))
    write("admission_review", "pod-create-deployment", review("Pod", "CREATE", DEPLOYMENT_POD, name=""))
    write("admission_review", "pod-create-dry-run", review("Pod", "CREATE", pod({"alibabacloud.com/eci": "true"}), dry_run=True))
    write("admission_review", "pod-update", review("Pod", "UPDATE", pod(), old=pod()))
    write("admission_review", "configmap-create", review(
        "ConfigMap", "CREATE", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}},
        resource="configmaps"))
    write("admission_review", "resourcepolicy-create-invalid", review(
        "ResourcePolicy", "CREATE",
        {"apiVersion": "scheduling.alibabacloud.com/v1alpha1", "kind": "ResourcePolicy",
         "metadata": {"name": "rp", "namespace": "default"},
         "spec": {"selector": {"app": "web"}, "strategy": "prefer",
                  "units": [{"resource": "ecs", "max": -1, "maxResources": {"cpu": "x"}}, {"resource": "acs"}],
                  "whenTryNextUnits": {"policy": "TimeoutOrExceedMax", "timeout": "0s"}}},
        group="scheduling.alibabacloud.com", resource="resourcepolicies", name="rp"))
    write("admission_review", "no-request", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})


def selector(name, spec, created="2026-01-01T00:00:00Z", namespace="default"):
    return {"apiVersion": "eci.aliyun.com/v1", "kind": "Selector",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created}, "spec": spec}


PROFILE = json.dumps([
    {"name": "eci-selector-1", "namespaceSelector": {"matchLabels": {"type": "eci"}},
     "objectSelector": {"matchLabels": {"created-by-eci": "true"}}},
    {"name": "gpu-namespace-selector-1", "namespaceSelector": {"matchLabels": {"gpu": "true"}},
     "effect": {"annotations": {"k8s.aliyun.com/eci-use-specs": "ecs.gn6v-c8g1.2xlarge"}}},
    {"name": "amd-object-selector-1", "objectSelector": {"matchLabels": {"amd": "true"}},
     "effect": {"annotations": {"k8s.aliyun.com/eci-use-specs": "ecs.c6a.xlarge"}}},
])

EFFECT = {"annotations": {"k8s.aliyun.com/eci-auto-imc": "true"}, "labels": {"eci-schedulable": "true"}}


def selector_eval():
    nginx = {"matchLabels": {"app": "nginx"}}
    with_requests = {"containers": [{"name": "app", "image": "nginx",
                                     "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]}
    write("selector_eval", "defaults-eci-label", {"pod": pod({"alibabacloud.com/eci": "true"}), "defaults": True})
    write("selector_eval", "virtual-node-only", {
        "pod": pod({"app": "nginx"}),
        "selectors": [selector("test-virtual-node-only", {"objectLabels": nginx, "effect": EFFECT,
                                                          "policy": {"virtualNodeOnly": {}}})]})
    write("selector_eval", "fair-with-namespace", {
        "pod": pod({"app": "nginx"}), "namespaceLabels": {"app": "test"},
        "selectors": [selector("test-fair", {"objectLabels": nginx, "namespaceLabels": {"matchLabels": {"app": "test"}},
                                             "effect": EFFECT, "policy": {"fair": {}}, "priority": 3})]})
    write("selector_eval", "normal-node-prefer-over-ratio", {
        "pod": pod({"app": "nginx"}, spec=with_requests),
        "selectors": [selector("prefer", {"objectLabels": nginx, "effect": EFFECT,
                                          "policy": {"normalNodePrefer": {"cpuRatio": 80, "memoryRatio": 90}}})],
        "capacity": {"normalAllocatable": {"cpu": "8", "memory": "16Gi"},
                     "normalRequested": {"cpu": "7", "memory": "8Gi"}}})
    write("selector_eval", "namespace-budget-exceeded", {
        "pod": pod({"app": "nginx"}, spec=with_requests),
        "selectors": [selector("cap", {"objectLabels": {},
                                       "policy": {"namespaceResourceLimit": {"namespace": "default",
                                                                             "limits": {"cpu": "3", "memory": "8Gi"}}}})],
        "capacity": {"vnodeRequested": {"default": {"cpu": "2", "memory": "1Gi"}}}})
    write("selector_eval", "priority-ties-and-expressions", {
        "pod": pod({"app": "nginx", "tier": "front"}),
        "ownNamespaceOnly": True,
        "selectors": [
            selector("b", {"objectLabels": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]},
                           "policy": {"normalNodeOnly": {}}, "priority": 5}),
            selector("a", {"objectLabels": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                           "effect": EFFECT, "priority": 5}, created="2026-01-01T00:00:00Z"),
            selector("c", {"objectLabels": nginx, "policy": {"fair": {}}, "priority": 5},
                     created="2025-06-01T00:00:00Z", namespace="other"),
        ]})
    write("selector_eval", "configmap-profile", {
        "pod": pod({"created-by-eci": "true", "amd": "true"}), "namespaceLabels": {"type": "eci"},
        "profile": PROFILE, "defaults": False})


REFERENCES = {
    "configMaps": [{"metadata": {"name": "app-config"}, "data": {"mode": "prod", "level": "debug", "bad key": "x"}},
                   {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\n"}}],
    "secrets": [{"metadata": {"name": "db"}, "data": {"password": "czNjcmV0"}},
                {"metadata": {"name": "pull"}, "type": "kubernetes.io/dockerconfigjson",
                 "data": {".dockerconfigjson": "eyJhdXRocyI6eyJodHRwczovL3JlZ2lzdHJ5LmV4YW1wbGUuY29tLyI6eyJhdXRoIjoiY205aWIzUTZjR0UxTlE9PSJ9fX0="}}],
    "services": [{"metadata": {"name": "redis", "namespace": "default"},
                  "spec": {"clusterIP": "10.96.3.4", "ports": [{"name": "tcp", "port": 6379, "protocol": "TCP"}]}}],
    "apiserver": {"metadata": {"name": "kubernetes", "namespace": "default"},
                  "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}},
    "kubeProxy": True,
}


def pod_to_eci():
    write("pod_to_eci", "minimal", pod())
    write("pod_to_eci", "deployment", dict(REFERENCES, pod=dict(DEPLOYMENT_POD, metadata=dict(
        DEPLOYMENT_POD["metadata"], name="web-7d4b9c8f6d-abcde", uid=UID))))
    write("pod_to_eci", "environment", dict(REFERENCES, pod=pod(annotations={"team": "a"}, spec={
        "serviceAccountName": "builder",
        "containers": [{"name": "app", "image": "app", "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}},
                        "envFrom": [{"configMapRef": {"name": "app-config"}, "prefix": "CFG_"}],
                        "command": ["sh", "-c", "echo $(POD_NAME) $$(escaped)"],
                        "env": [
                            {"name": "LITERAL", "value": "x"},
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
                            {"name": "OPTIONAL", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k", "optional": True}}},
                            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                            {"name": "URL", "value": "http://$(REDIS_SERVICE_HOST):$(REDIS_SERVICE_PORT)/$(MODE)"}]}]})))
    write("pod_to_eci", "volumes", dict(REFERENCES, pod=pod(spec={
        "containers": [{"name": "app", "image": "app", "volumeMounts": [
            {"name": "scratch", "mountPath": "/tmp"}, {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {"name": "creds", "mountPath": "/etc/creds"}, {"name": "info", "mountPath": "/etc/info"},
            {"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
            {"name": "share", "mountPath": "/share", "subPath": "web"}]}],
        "volumes": [
            {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
            {"name": "config", "configMap": {"name": "app-config", "items": [{"key": "mode", "path": "mode.txt", "mode": 256}], "defaultMode": 420}},
            {"name": "creds", "secret": {"secretName": "db"}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                                                       {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}]}},
            {"name": "api", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "app-config", "items": [{"key": "level", "path": "level"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            {"name": "vault", "projected": {"sources": [
                {"serviceAccountToken": {"path": "vault-token", "audience": "vault", "expirationSeconds": 600}}]}},
            {"name": "share", "nfs": {"server": "nas.example.com", "path": "/exports", "readOnly": False}}]})))
    write("pod_to_eci", "probes-and-pod-settings", dict(REFERENCES, pod=pod(annotations={
        "k8s.aliyun.com/eci-spot-strategy": "SpotWithPriceLimit", "k8s.aliyun.com/eci-spot-price-limit": "0.25",
        "k8s.aliyun.com/eci-vswitch": "vsw-a,vsw-b", "k8s.aliyun.com/eci-auto-imc": "true",
        "k8s.aliyun.com/eci-ram-role-name": "reader", "k8s.aliyun.com/eci-use-specs": "2-4Gi,ecs.c6.large",
        "k8s.aliyun.com/eci-kube-proxy-enabled": "false"}, spec={
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 45, "activeDeadlineSeconds": 600,
        "dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["corp"], "options": [{"name": "ndots", "value": "2"}]},
        "hostAliases": [{"ip": "10.0.0.1", "hostnames": ["db.local"]}], "imagePullSecrets": [{"name": "pull"}, {"name": "absent"}],
        "initContainers": [{"name": "init", "image": "busybox", "command": ["true"]}],
        "containers": [{"name": "app", "image": "registry.example.com/app:1",
                        "resources": {"limits": {"cpu": "1", "memory": "2Gi"}},
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
                        "livenessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 3},
                        "startupProbe": {"httpGet": {"path": "/started", "port": 8080}, "initialDelaySeconds": 10,
                                         "periodSeconds": 5, "failureThreshold": 6},
                        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
                        "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]},
                                            "runAsUser": 1000, "readOnlyRootFilesystem": True}}]})))


# DescribeContainerGroups as the service documents it (provider/src/eci/openapi/response.rs).
DESCRIBE_GROUPS = {
    "RequestId": "89945DD3-9072-47D0-A318-353284CFC7B3", "NextToken": "", "TotalCount": 1,
    "ContainerGroups": [{
        "ContainerGroupId": "eci-bp1dvysdafbh00t7****", "ContainerGroupName": "default-web-0",
        "RegionId": "cn-hangzhou", "ZoneId": "cn-hangzhou-k", "Status": "Running", "IntranetIp": "172.16.0.1",
        "InternetIp": None, "CreationTime": "2026-11-21T08:00:00Z", "SucceededTime": "", "RestartPolicy": "Always",
        "Cpu": 2.0, "Memory": 4.0, "Tags": [{"Key": "k8s.aliyun.com/pod-uid", "Value": UID}],
        "Events": [{"Count": 1, "Type": "Normal", "Name": "pod.default-web-0", "Reason": "Started",
                    "Message": "Started container app", "FirstTimestamp": "2026-11-21T08:00:03Z",
                    "LastTimestamp": "2026-11-21T08:00:03Z"}],
        "Containers": [{
            "Name": "app", "Image": "nginx:1.27", "Cpu": 1.0, "Memory": 2.0, "Ready": True, "RestartCount": 2,
            "ContainerId": "3f1e0c", "Started": True,
            "CurrentState": {"State": "Running", "DetailStatus": "", "StartTime": "2026-11-21T08:00:03Z", "ExitCode": None},
            "PreviousState": {"State": "Terminated", "Reason": "Error", "ExitCode": 137, "Signal": 9,
                              "StartTime": "2026-11-21T07:59:00Z", "FinishTime": "2026-11-21T07:59:30Z"}}],
        "InitContainers": [{"Name": "init", "Image": "busybox", "CurrentState": {
            "State": "Terminated", "ExitCode": 0, "Reason": "Completed",
            "StartTime": "2026-11-21T07:58:00Z", "FinishTime": "2026-11-21T07:58:01Z"}}],
    }],
}

SCHEDULE_FAILED = {
    "RequestId": "R-2", "ContainerGroups": [{
        "ContainerGroupId": "eci-2", "ContainerGroupName": "default-web-0", "Status": "ScheduleFailed",
        "Events": [{"Type": "Warning", "Reason": "NoStock", "Message": "the zone has no stock of ecs.c6.large"}],
        "Containers": [{"Name": "app", "CurrentState": {"State": "Waiting", "Reason": "ContainerCreating"}}]}]}

# DescribeContainerGroupStatus as the service documents it.
STATUS_PAGE = {
    "RequestId": "1340C38D-6189-54D1-86F6-7D5ECF3E0088", "NextToken": "d78f2dd8-5979-42fe-****-b16db43be5bc",
    "TotalCount": 1, "Data": [{
        "ContainerGroupId": "eci-bp1jrgfqqy54kg5hc****", "Name": "nginx", "Namespace": "default",
        "Status": "Running", "PodStatus": {
            "Phase": "Running", "PodIp": "192.168.1.10", "PodIps": [{"Ip": "192.168.1.10"}],
            "HostIp": "192.168.1.10", "StartTime": "2026-11-21T08:00:00Z",
            "ContainerStatuses": [{"Name": "nginx", "Ready": True, "RestartCount": 0,
                                   "State": {"Running": {"StartedAt": "2026-11-21T08:00:03Z"}}}]}}]}


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, value):
    """One protobuf field: bytes/str/message (wire type 2), bool/int (wire type 0)."""
    if isinstance(value, bool) or isinstance(value, int):
        return varint(number << 3) + varint(int(value))
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def message(*fields):
    return b"".join(field(n, v) for n, v in fields)


def grpc_status_page():
    """DescribeContainerGroupStatusResponse as mock-eci's gRPC service sends it."""
    running = message((1, "Running"), (7, "2026-11-21T08:00:03Z"))
    terminated = message((1, "Terminated"), (3, 137), (4, "Error"), (6, 9),
                         (7, "2026-11-21T07:59:00Z"), (8, "2026-11-21T07:59:30Z"))
    app = message((1, "app"), (2, "nginx:1.27"), (6, True), (7, 1), (8, running), (9, terminated),
                  (19, True), (20, "3f1e0c"))
    init = message((1, "init"), (8, message((1, "Terminated"), (3, 0), (4, "Completed"))))
    event = message((1, 1), (2, "Warning"), (4, "BackOff"), (5, "Back-off restarting failed container"))
    group = message((1, "eci-1"), (2, "default-web-0"), (3, "Running"), (4, "172.16.0.9"),
                    (5, "2026-11-21T08:00:00Z"), (9, app), (10, init), (11, event))
    return message((1, "R-3"), (2, group), (4, 1))


def eci_to_status():
    gated = pod(spec={"containers": [{"name": "app", "image": "nginx:1.27"}],
                      "initContainers": [{"name": "init", "image": "busybox"}],
                      "readinessGates": [{"conditionType": "example.com/ready"}]},
                status={"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T07:57:00Z"},
                    {"type": "example.com/ready", "status": "False", "lastTransitionTime": "2026-11-21T07:57:00Z"}]})
    gated["metadata"]["generation"] = 2
    plain = json.dumps(pod()).encode()
    write("eci_to_status", "describe-groups", json.dumps(gated).encode() + b"\0" + json.dumps(DESCRIBE_GROUPS).encode())
    write("eci_to_status", "schedule-failed", plain + b"\0" + json.dumps(SCHEDULE_FAILED).encode())
    write("eci_to_status", "status-page", plain + b"\0" + json.dumps(STATUS_PAGE).encode())
    write("eci_to_status", "grpc-status", json.dumps(gated).encode() + b"\0" + grpc_status_page())


def metric_record(time, core_nanos):
    return {"Timestamp": time,
            "Cpu": {"UsageNanoCores": 250000000, "UsageCoreNanoSeconds": core_nanos, "Load": 0, "Limit": 2000},
            "Memory": {"UsageBytes": 104857600, "WorkingSet": 83886080, "Rss": 62914560, "Cache": 1048576,
                       "AvailableBytes": 0},
            "Network": {"Interfaces": [{"Name": "eth0", "RxBytes": 123456, "RxPackets": 100, "RxErrors": 0,
                                        "TxBytes": 654321, "TxPackets": 90, "TxErrors": 0}]},
            "Filesystem": [{"FsName": "/dev/vda1", "UsageBytes": 1048576, "CapacityBytes": 21474836480,
                            "AvailableBytes": 21473787904}],
            "Containers": [{"Name": "app", "Cpu": {"UsageNanoCores": 200000000, "UsageCoreNanoSeconds": core_nanos - 1000},
                            "Memory": {"UsageBytes": 94371840, "WorkingSet": 73400320, "Rss": 52428800}}]}


def openapi_response():
    write("openapi_response", "describe-groups", DESCRIBE_GROUPS)
    write("openapi_response", "status-page", STATUS_PAGE)
    write("openapi_response", "create", {"RequestId": "R-1", "ContainerGroupId": "eci-bp1dvysdafbh00t7****"})
    write("openapi_response", "create-foreign-shape", {"RequestId": "R-1", "ContainerGroupId": 42})
    write("openapi_response", "log", {"RequestId": "R-4", "ContainerName": "app",
                                      "Content": "2026-11-21T08:00:03.123456789Z hello\n2026-11-21T08:00:04Z world\ncontinued\n"})
    write("openapi_response", "exec", {"RequestId": "R-5", "WebSocketUri": "wss://eci-exec.example.com/session?token=t",
                                       "HttpUrl": "", "SyncResponse": ""})
    write("openapi_response", "metric", {"RequestId": "R-6", "ContainerGroupId": "eci-1", "Records": [
        metric_record("2026-11-21T08:00:00Z", 1000000000), metric_record("2026-11-21T08:00:15Z", 4750000000)]})
    write("openapi_response", "multi-metric", {"RequestId": "R-7", "MonitorDatas": [
        {"ContainerGroupId": "eci-1", "Records": [metric_record("2026-11-21T08:00:15Z", 4750000000)]},
        {"ContainerGroupId": "eci-2", "Records": []}]})
    write("openapi_response", "service-error", {"RequestId": "R-8", "Code": "Throttling.User",
                                                "Message": "Request was denied due to user flow control."})


def http(head, body=b""):
    return head.replace("\n", "\r\n").encode() + b"\r\n\r\n" + body


LOG_PAGE = (b"2026-11-21T08:00:03.123456789Z GET / 200\n"
            b"2026-11-21T08:00:03.123456789Z GET / 200\n"
            b"2026-11-21T08:00:04Z panic: boom\n"
            b"goroutine 1 [running]:\r\n"
            b"2026-11-21T08:00:05.5+08:00 restarted\n")


def kubelet_request():
    write("kubelet_request", "logs-follow", http(
        "GET /containerLogs/default/web-0/app?follow=true&timestamps=true&tailLines=10&limitBytes=4096 HTTP/1.1\n"
        "Host: 10.0.0.5:10250\nAuthorization: Bearer abc", LOG_PAGE))
    write("kubelet_request", "logs-since-time", http(
        "GET /containerLogs/default/web-0/app?sinceTime=2026-11-21T08%3A00%3A04Z&previous=1&tail=all HTTP/1.1",
        LOG_PAGE))
    write("kubelet_request", "logs-since-seconds", http(
        "GET /containerLogs/default/web-0/app?sinceSeconds=3600&stream=All&insecureSkipTLSVerifyBackend=true HTTP/1.1",
        LOG_PAGE))
    write("kubelet_request", "exec-spdy", http(
        "POST /exec/default/web-0/app?command=sh&command=-c&command=echo+%22a+b%22&input=1&output=1&tty=1 HTTP/1.1\n"
        "Connection: Upgrade\nUpgrade: SPDY/3.1\n"
        "X-Stream-Protocol-Version: v5.channel.k8s.io\nX-Stream-Protocol-Version: v4.channel.k8s.io, v3.channel.k8s.io",
        b'{"Width":80,"Height":24}{"Width":100,'))
    write("kubelet_request", "attach-websocket", http(
        "GET /attach/default/web-0/8c3c5f5e-0000-4000-8000-000000000001/app?stdout=true&stderr=true HTTP/1.1\n"
        "Connection: Upgrade\nUpgrade: websocket\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\n"
        "Sec-WebSocket-Protocol: v4.base64.channel.k8s.io"))
    write("kubelet_request", "portforward-websocket", http(
        "GET /portForward/default/web-0?ports=8080,%209090&port=53 HTTP/1.1\n"
        "Connection: Upgrade\nUpgrade: websocket\nSec-WebSocket-Protocol: portforward.k8s.io"))
    write("kubelet_request", "portforward-spdy", http(
        "POST /portForward/default/web-0 HTTP/1.1\nConnection: Upgrade\nUpgrade: SPDY/3.1\n"
        "X-Stream-Protocol-Version: portforward.k8s.io"))
    write("kubelet_request", "stats-summary", http("GET /stats/summary?only_cpu_and_memory=true HTTP/1.1"))
    write("kubelet_request", "metrics-resource", http("GET /metrics/resource HTTP/1.1"))
    write("kubelet_request", "pods", http("GET /pods HTTP/1.1"))


def spdy_dictionary():
    """The SPDY/3 dictionary, read from the product's dictionary.rs and checked as it checks it."""
    text = (ROOT / "provider/src/kubelet/spdy/dictionary.rs").read_text()
    words = re.search(r"const WORDS: &\[&str\] = &\[(.*?)\];", text, re.S).group(1)
    tail = re.search(r"const TAIL: &str = concat!\((.*?)\);", text, re.S).group(1)
    out = bytearray()
    for word in re.findall(r'"([^"]*)"', words):
        out += struct.pack(">I", len(word)) + word.encode()
    out += "".join(re.findall(r'"([^"]*)"', tail)).encode()
    assert len(out) == 1423 and zlib.adler32(bytes(out)) == 0xE3C6A7C2, "not the SPDY/3 dictionary"
    return bytes(out)


def spdy_frames():
    dictionary = spdy_dictionary()
    compress = zlib.compressobj(zdict=dictionary)

    def block(headers):
        raw = struct.pack(">I", len(headers))
        for name, value in headers:
            raw += struct.pack(">I", len(name)) + name.encode() + struct.pack(">I", len(value)) + value.encode()
        return compress.compress(raw) + compress.flush(zlib.Z_SYNC_FLUSH)

    def control(kind, flags, payload):
        return struct.pack(">HHI", 0x8003, kind, flags << 24 | len(payload)) + payload

    def data(stream, flags, payload):
        return struct.pack(">II", stream, flags << 24 | len(payload)) + payload

    def syn_stream(stream, headers, flags=0):
        return control(1, flags, struct.pack(">IIBB", stream, 0, 0, 0) + block(headers))

    # exec as kubectl opens it through the apiserver: error, stdin, stdout, resize streams.
    exec_session = b"".join([
        syn_stream(1, [("streamtype", "error")]),
        syn_stream(3, [("streamtype", "stdin")]),
        syn_stream(5, [("streamtype", "stdout")]),
        syn_stream(7, [("streamtype", "resize")]),
        data(3, 0, b"ls -l\n"),
        data(7, 0, b'{"Width":80,"Height":24}'),
        control(9, 0, struct.pack(">II", 5, 65536)),  # WINDOW_UPDATE
        control(6, 0, struct.pack(">I", 1)),  # PING
        data(3, 1, b""),  # FIN on stdin
    ])
    write("spdy_frame", "exec-session", exec_session)
    compress = zlib.compressobj(zdict=dictionary)
    port_forward = b"".join([
        syn_stream(1, [("port", "8080"), ("requestid", "0"), ("streamtype", "error")]),
        syn_stream(3, [("port", "8080"), ("requestid", "0"), ("streamtype", "data")]),
        data(3, 0, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        control(3, 0, struct.pack(">II", 3, 5)),  # RST_STREAM CANCEL
        control(7, 0, struct.pack(">II", 3, 0)),  # GOAWAY
    ])
    write("spdy_frame", "port-forward", port_forward)
    compress = zlib.compressobj(zdict=dictionary)
    write("spdy_frame", "settings-and-headers", b"".join([
        control(4, 1, struct.pack(">IIIII", 2, 0x01000007, 1 << 20, 4, 100)),  # SETTINGS, clear
        syn_stream(1, [("streamtype", "data"), ("x", "a\0b")], flags=2),
        control(2, 1, struct.pack(">I", 1) + block([("status", "200")])),  # SYN_REPLY
        control(8, 0, struct.pack(">I", 1) + block([])),  # HEADERS
        control(0xFF, 0, b""),  # an unknown control frame
    ]))
    write("spdy_frame", "ping", control(6, 0, struct.pack(">I", 1)))


RESOURCE_POLICY = {
    "selector": {"app": "nginx"}, "strategy": "prefer",
    "units": [{"resource": "ecs", "nodeSelector": {"paidtype": "subscription"}, "max": 2},
              {"resource": "ecs", "nodeSelector": {"paidtype": "pay-as-you-go"}},
              {"resource": "eci"}],
}


def resource_policy():
    views = [{"pods": 2, "used": {"cpu": "4"}, "terminating": 0, "hasRoom": True},
             {"pods": 0, "used": {}, "terminating": 0, "hasRoom": True},
             {"pods": 0, "used": {}, "terminating": 0, "hasRoom": True}]
    write("resource_policy", "prefer-three-units", {
        "spec": RESOURCE_POLICY, "views": views, "requests": {"cpu": "2"}, "labels": {"app": "nginx"},
        "waitedSeconds": 0})
    write("resource_policy", "timeout-or-exceed-max", {
        "apiVersion": "scheduling.alibabacloud.com/v1alpha1", "kind": "ResourcePolicy",
        "metadata": {"name": "rp", "namespace": "default"},
        "spec": {"units": [
            {"resource": "ecs", "maxResources": {"cpu": "4", "memory": "8Gi"},
             "podLabels": {"k8s.aliyun.com/resource-policy-wait-for-ecs-scaling": "true", "unit": "ecs"},
             "podAnnotations": {"unit": "ecs"}},
            {"resource": "eci", "max": 10}],
            "matchLabelKeys": ["app", "version"], "ignorePreviousPod": True, "ignoreTerminatingPod": False,
            "whenTryNextUnits": {"policy": "TimeoutOrExceedMax", "timeout": "1m30s"}},
        "views": [{"pods": 1, "used": {"cpu": "3500m", "memory": "6Gi"}, "terminating": 1, "hasRoom": False}],
        "requests": {"cpu": "500m", "memory": "1Gi"}, "labels": {"app": "web", "version": "v2"},
        "waitedSeconds": 45.5,
        "existingTerms": [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]})
    write("resource_policy", "lack-resource-and-no-terminating", {
        "spec": dict(RESOURCE_POLICY, whenTryNextUnits={"policy": "LackResourceAndNoTerminating"}),
        "views": [{"pods": 1, "terminating": 2, "hasRoom": False}], "requests": {"cpu": "1"}})
    write("resource_policy", "invalid", {"spec": {
        "strategy": "spread", "units": [{"resource": "acs", "max": -1, "maxResources": {"cpu": "-1", "gpu": "x"}}],
        "matchLabelKeys": [""], "whenTryNextUnits": {"policy": "Sometimes", "timeout": "1.5.5s"}}})


if __name__ == "__main__":
    admission_review()
    selector_eval()
    pod_to_eci()
    eci_to_status()
    openapi_response()
    kubelet_request()
    spdy_frames()
    resource_policy()
