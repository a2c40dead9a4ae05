"""Runs rendered Kubernetes pods as local processes, the way the kubelet would start and
probe them, with every address moved to 127.0.0.1 and every container port remapped to a
free local port. Used by chart_processes_test.py.

What is emulated: a container's command + args with its env (value, ConfigMap envFrom,
fieldRef metadata.name/namespace, Secret keys) and kubelet's $(VAR) expansion; Service and
pod DNS names (<svc>.<ns>.svc.cluster.local, <pod>.<svc>.<ns>.svc.cluster.local) resolve to
the backing pod's remapped port; httpGet / tcpSocket / grpc probes as the kubelet sends
them (HTTP success is 200-399). The image's /opt/kvmesh is the staged layout of
deploy/docker/build-in-image.sh."""
import http.client
import os
import re
import signal
import socket
import subprocess

import grpc

IMAGE_PREFIX = "/opt/kvmesh"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_DNS = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?)\.svc\.cluster\.local:(\d+)")
_ANY = re.compile(r"^(0\.0\.0\.0|\[::\]|::):(\d+)$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    def __init__(self, name, owner, spec, labels):
        self.name, self.owner, self.spec, self.labels = name, owner, spec, labels
        (self.container,) = spec["containers"]
        self.ports = {p["containerPort"]: free_port() for p in self.container.get("ports", [])}
        self.port_names = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        self.proc = None
        self.log_path = None
        self.argv = None
        self.env = None

    def local_port(self, port):
        """A container port (number or name) -> its local port."""
        number = self.port_names[port] if isinstance(port, str) else port
        return self.ports[number]

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()


class Cluster:
    def __init__(self, docs, namespace, image_root, run_dir):
        self.namespace, self.image_root, self.run_dir = namespace, image_root, run_dir
        self.configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
        self.secrets = {d["metadata"]["name"]: d.get("stringData", {}) for d in docs if d["kind"] == "Secret"}
        self.services = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
        self.pods = {}
        for d in docs:
            if d["kind"] not in ("Deployment", "StatefulSet"):
                continue
            n = d["spec"].get("replicas", 1)
            for i in range(n):
                # StatefulSet pods are <name>-<ordinal>; a Deployment's get a random suffix.
                name = f"{d['metadata']['name']}-{i}" if d["kind"] == "StatefulSet" else \
                    f"{d['metadata']['name']}-7c9f8d-{i}"
                t = d["spec"]["template"]
                self.pods[name] = Pod(name, d, t["spec"], t["metadata"]["labels"])

    # ---- name resolution ----
    def _service_pods(self, service):
        selector = self.services[service]["selector"]
        return [p for p in self.pods.values() if all(p.labels.get(k) == v for k, v in selector.items())]

    def _service_target(self, service, port):
        for sp in self.services[service]["ports"]:
            if sp["port"] == port:
                return sp.get("targetPort", port)
        raise KeyError(f"service {service} has no port {port}")

    def resolve(self, host, port):
        """<svc>.<ns> or <pod>.<svc>.<ns> (without .svc.cluster.local) -> 127.0.0.1:port."""
        parts = host.split(".")
        if len(parts) == 2 and parts[1] == self.namespace:
            service = parts[0]
            backends = self._service_pods(service)
            if not backends:
                raise KeyError(f"service {service} selects no pod")
            pod = backends[0]
        elif len(parts) == 3 and parts[2] == self.namespace:
            pod_name, service = parts[0], parts[1]
            pod = self.pods[pod_name]
            assert pod in self._service_pods(service), f"{pod_name} is not behind {service}"
        else:
            raise KeyError(f"cannot resolve {host}")
        return f"127.0.0.1:{pod.local_port(self._service_target(service, port))}"

    # ---- a container's process ----
    def _env(self, pod):
        env = {}
        c = pod.container
        for src in c.get("envFrom", []):
            env.update(self.configmaps[src["configMapRef"]["name"]])
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), e["value"])
            elif "fieldRef" in e["valueFrom"]:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {"metadata.name": pod.name, "metadata.namespace": self.namespace}[field]
            elif "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
            else:
                raise ValueError(f"unsupported env source {e}")
        return env

    def _localize(self, pod, text):
        text = text.replace(IMAGE_PREFIX, self.image_root)
        text = _DNS.sub(lambda m: self.resolve(m.group(1), int(m.group(3))), text)
        return text

    def _localize_arg(self, pod, arg):
        arg = self._localize(pod, arg)
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            if (m := _ANY.match(value)) and int(m.group(2)) in pod.ports:
                value = f"127.0.0.1:{pod.ports[int(m.group(2))]}"
            elif value == "0.0.0.0":
                value = "127.0.0.1"
            elif flag.endswith("port") and value.isdigit() and int(value) in pod.ports:
                value = str(pod.ports[int(value)])
            arg = f"{flag}={value}"
        return arg

    def command_line(self, pod):
        env = self._env(pod)
        expand = lambda s: _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), s)  # noqa: E731
        argv = [expand(a) for a in pod.container["command"] + pod.container.get("args", [])]
        argv = [self._localize_arg(pod, a) for a in argv]
        env = {k: self._localize(pod, v) for k, v in env.items()}
        return argv, env

    def start(self, name):
        pod = self.pods[name]
        pod.argv, pod.env = self.command_line(pod)
        pod.log_path = os.path.join(self.run_dir, f"{name}.log")
        with open(pod.log_path, "w") as log:
            # A container's environment: its own variables and little else.
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": name, **pod.env}
            pod.proc = subprocess.Popen(pod.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        return pod

    def terminate(self, name):
        """What the kubelet does on pod deletion after preStop: SIGTERM the container."""
        self.pods[name].proc.send_signal(signal.SIGTERM)

    def stop_all(self):
        for pod in self.pods.values():
            if pod.proc and pod.proc.poll() is None:
                pod.proc.send_signal(signal.SIGTERM)
        for pod in self.pods.values():
            if pod.proc:
                try:
                    pod.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pod.proc.kill()
                    pod.proc.wait()


def _health_check_request():
    return b""  # grpc.health.v1.HealthCheckRequest{service: ""}: every field default


def probe(pod, kind, timeout_s=1.0):
    """One kubelet probe of `kind` (startupProbe, readinessProbe, livenessProbe): returns
    (ok, detail)."""
    spec = pod.container[kind]
    if "httpGet" in spec:
        h = spec["httpGet"]
        conn = http.client.HTTPConnection("127.0.0.1", pod.local_port(h["port"]), timeout=timeout_s)
        try:
            conn.request("GET", h.get("path", "/"), headers={"User-Agent": "kube-probe/1.35", "Accept": "*/*"})
            r = conn.getresponse()
            body = r.read().decode(errors="replace")
            return 200 <= r.status < 400, f"{r.status} {body}"
        except OSError as e:
            return False, f"{type(e).__name__}: {e}"
        finally:
            conn.close()
    if "tcpSocket" in spec:
        try:
            with socket.create_connection(("127.0.0.1", pod.local_port(spec["tcpSocket"]["port"])), timeout=timeout_s):
                return True, "connected"
        except OSError as e:
            return False, f"{type(e).__name__}: {e}"
    if "grpc" in spec:
        address = f"127.0.0.1:{pod.local_port(spec['grpc']['port'])}"
        with grpc.insecure_channel(address) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda x: x, response_deserializer=lambda x: x)
            try:
                response = check(_health_check_request(), timeout=timeout_s)
            except grpc.RpcError as e:
                return False, f"grpc {e.code().name}"
            # HealthCheckResponse{status = 1 (SERVING)} is the two bytes 08 01.
            return response == b"\x08\x01", f"grpc status bytes {response.hex()}"
    raise ValueError(f"unsupported probe {spec}")
