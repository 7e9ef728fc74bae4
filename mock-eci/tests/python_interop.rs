//! The contract from another language: Python's protoc (grpcio-tools) compiles `eci.proto`,
//! and a Python gRPC client drives a real mock-eci over loopback. `.ci/run` installs
//! grpcio-tools; without it this test fails and says how to install it.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use clap::Parser;
use mock_eci::{MockConfig, MockServer};

const CLIENT: &str = r#"
import sys, grpc
sys.path.insert(0, sys.argv[2])
from eci.v20180808 import eci_pb2, eci_pb2_grpc
stub = eci_pb2_grpc.EciStub(grpc.insecure_channel(sys.argv[1]))
created, call = stub.CreateContainerGroup.with_call(eci_pb2.CreateContainerGroupRequest(
    region_id="cn-hangzhou", security_group_id="sg-py", v_switch_id="vsw-py",
    container_group_name="from-python", client_token="py-1",
    tag=[eci_pb2.Tag(key="lang", value="python")],
    container=[eci_pb2.Container(name="app", image="nginx", cpu=0.5, memory=1.0)]))
metadata = dict(call.trailing_metadata() or ()) | dict(call.initial_metadata() or ())
assert metadata["x-acs-request-id"] == created.request_id, metadata
listed = stub.DescribeContainerGroups(eci_pb2.DescribeContainerGroupsRequest(
    region_id="cn-hangzhou", container_group_ids=[created.container_group_id]))
group = listed.container_groups[0]
assert group.container_group_name == "from-python" and group.cpu == 0.5, group
try:
    stub.CreateContainerGroup(eci_pb2.CreateContainerGroupRequest(region_id="cn-hangzhou",
        security_group_id="sg", v_switch_id="vsw", container_group_name="Bad_Name",
        container=[eci_pb2.Container(name="app", image="nginx")]))
    raise SystemExit("an invalid name was accepted")
except grpc.RpcError as error:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.code()
    codes = dict(error.trailing_metadata())
    assert codes["x-acs-error-code"] == "InvalidParameter.ContainerGroupName", codes
print(created.container_group_id)
"#;

fn python_has_grpc_tools() -> bool {
    Command::new("python3")
        .args(["-c", "import grpc_tools, grpc"])
        .status()
        .is_ok_and(|status| status.success())
}

#[tokio::test]
async fn python_client_speaks_to_mock_eci() {
    assert!(
        python_has_grpc_tools(),
        "python3 with grpcio-tools is needed for this test: `python3 -m pip install grpcio-tools` (the CI script .ci/run installs it)"
    );
    let out = tempfile::tempdir().unwrap();
    let proto_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let compiled = Command::new("python3")
        .args(["-m", "grpc_tools.protoc"])
        .arg(format!("-I{}", proto_root.display()))
        .arg(format!("--python_out={}", out.path().display()))
        .arg(format!("--grpc_python_out={}", out.path().display()))
        .arg(proto_root.join("eci/v20180808/eci.proto"))
        .output()
        .unwrap();
    assert!(
        compiled.status.success(),
        "protoc failed: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );

    let server = MockServer::start(MockConfig::parse_from([
        "mock-eci",
        "--listen",
        "127.0.0.1:0",
    ]))
    .await
    .unwrap();
    let target = server.grpc_addr().to_string();
    let script_dir = out.path().to_owned();
    let run = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg("-c")
            .arg(CLIENT)
            .arg(target)
            .arg(script_dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        run.status.success(),
        "python client failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let id = String::from_utf8_lossy(&run.stdout).trim().to_owned();
    assert!(
        server
            .mock()
            .groups()
            .iter()
            .any(|group| group.container_group_id == id)
    );
    server.stop().await.unwrap();
}
