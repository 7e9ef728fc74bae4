//! The admin HTTP endpoint: health, Prometheus metrics, run-time switches and test hooks.
//!
//! | method and path | what it does |
//! | --- | --- |
//! | `GET /healthz` | `ok` |
//! | `GET /metrics` | Prometheus text exposition |
//! | `GET /admin/controls` | the switches as JSON |
//! | `PATCH /admin/controls` | change switches: `{"outage": true}`, `{"rate_limits_enabled": false}`, `{"faults": {"*": {"error_rate": 0.5, "error_code": "InternalError", "latency_ms": 20}}}` (any code the service answers: `Forbidden.RAM`, `InvalidAccessKeyId.NotFound`, `Account.Arrearage`, …; `SDK.ForeignResponse` answers as a proxy in front of ECI would: an HTML 403 on the OpenAPI front, a gRPC `PermissionDenied` without an ECI code on the gRPC one), `{"rate_limits": {"CreateContainerGroup": {"per_minute": 60, "burst": 5}}}`, `{"no_stock": true}` (every new group ends `ScheduleFailed`), `{"no_stock_zones": ["cn-hangzhou-a"]}` (those zones, replacing the set: a create lands in another zone it lists or is refused `OperationDenied.NoStock`), `{"vswitch_zones": {"vsw-a": "cn-hangzhou-a"}}` (adds vSwitch → zone entries; others are in `--zone`), `{"max_groups": 10}` (`null` removes the cap), `{"denied": {"ram_roles": ["AdminRole"], "security_groups": ["sg-platform"]}}` (a create naming one of them is answered `Forbidden.RAM`, HTTP 403 / gRPC `PermissionDenied`; `{}` denies nothing) |
//! | `GET /admin/groups` | every group as DescribeContainerGroups shows it, events included |
//! | `POST /admin/groups/{id}/vanish` | the group disappears out of band |
//! | `POST /admin/groups/{id}/announce-reclaim` | the spot reclaim is announced (a Warning `SpotToBeReleased` event, as the service gives about 3 minutes ahead); the group runs on |
//! | `POST /admin/groups/{id}/expire` | the group is reclaimed and ends `Expired` |
//! | `GET /exec/{session}` | the WebSocket of an interactive `ExecContainerCommand` (see `exec_session`) |
//! | `POST /admin/groups/{id}/containers/{name}/log` | the body's lines are written into the running container's log, now |
//! | `POST /admin/groups/{id}/containers/{name}/exit` | the running container exits now: `{"exit_code": 3}` (default 0) |
//! | `GET /admin/usage` | the load rules the metric calls follow |
//! | `PUT /admin/usage` | new load rules from now on: `{"rules": [{"group_name_prefix": "ns-web-", "container": "app", "cpu": 0.8, "memory_bytes": 104857600}]}` (see `engine::usage`) |

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use eci_proto::EciError;

use crate::service::MockEci;
use crate::service::controls::ControlsPatch;

/// The admin routes.
pub fn router(mock: MockEci) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/admin/controls", get(controls).patch(patch_controls))
        .route("/admin/groups", get(groups))
        .route("/admin/groups/{id}/request", get(created_with))
        .route("/admin/groups/{id}/vanish", post(vanish))
        .route("/admin/groups/{id}/expire", post(expire))
        .route(
            "/admin/groups/{id}/announce-reclaim",
            post(announce_reclaim),
        )
        .route("/admin/groups/{id}/containers/{name}/log", post(append_log))
        .route(
            "/admin/groups/{id}/containers/{name}/exit",
            post(exit_container),
        )
        .route("/admin/usage", get(loads).put(set_loads))
        .route("/exec/{session}", get(super::exec_session::serve))
        .with_state(mock)
}

/// What group `id` was created with: the parameters as the fake received them.
async fn created_with(State(mock): State<MockEci>, Path(id): Path<String>) -> Response {
    match mock.created_with(&id) {
        Some(request) => Json(request).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no group {id}")).into_response(),
    }
}

async fn loads(State(mock): State<MockEci>) -> Response {
    Json(mock.loads()).into_response()
}

async fn set_loads(
    State(mock): State<MockEci>,
    Json(rules): Json<crate::engine::usage::LoadRules>,
) -> Response {
    match mock.set_loads(rules) {
        Ok(view) => {
            tracing::info!(rules = ?view.rules, "load rules changed");
            Json(view).into_response()
        }
        Err(message) => (StatusCode::BAD_REQUEST, message).into_response(),
    }
}

async fn metrics(State(mock): State<MockEci>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        mock.render_metrics(),
    )
        .into_response()
}

async fn controls(State(mock): State<MockEci>) -> Response {
    Json(mock.controls()).into_response()
}

async fn patch_controls(State(mock): State<MockEci>, Json(patch): Json<ControlsPatch>) -> Response {
    match mock.patch_controls(&patch) {
        Ok(view) => {
            tracing::info!(?patch, "controls changed");
            Json(view).into_response()
        }
        Err(message) => (StatusCode::BAD_REQUEST, message).into_response(),
    }
}

async fn groups(State(mock): State<MockEci>) -> Response {
    Json(mock.groups()).into_response()
}

async fn vanish(State(mock): State<MockEci>, Path(id): Path<String>) -> Response {
    answer(mock.vanish(&id))
}

async fn announce_reclaim(State(mock): State<MockEci>, Path(id): Path<String>) -> Response {
    answer(mock.announce_reclaim(&id))
}

async fn expire(State(mock): State<MockEci>, Path(id): Path<String>) -> Response {
    answer(mock.expire(&id))
}

async fn append_log(
    State(mock): State<MockEci>,
    Path((id, name)): Path<(String, String)>,
    body: String,
) -> Response {
    let lines: Vec<String> = body.lines().map(str::to_owned).collect();
    answer(mock.append_log(&id, &name, &lines))
}

/// The body of `POST …/exit`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Exit {
    exit_code: i32,
}

async fn exit_container(
    State(mock): State<MockEci>,
    Path((id, name)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let exit: Exit = if body.is_empty() {
        Exit::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(exit) => exit,
            Err(error) => return (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
        }
    };
    answer(mock.exit_container(&id, &name, exit.exit_code))
}

fn answer(result: Result<(), EciError>) -> Response {
    match result {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(error) if error.is_not_found() => {
            (StatusCode::NOT_FOUND, error.message).into_response()
        }
        Err(error) => (
            StatusCode::CONFLICT,
            format!("{}: {}", error.code, error.message),
        )
            .into_response(),
    }
}
