//! The OpenAPI client against mock-eci's OpenAPI front on 127.0.0.1:0: real HTTPS (the front's
//! own CA), every request's signature verified with the same secret, the flat parameters
//! decoded independently of the client's flattening, responses in the service's JSON shapes.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use eci_proto::v20180808::{
    Container, CreateContainerGroupRequest, DeleteContainerGroupRequest,
    DescribeContainerGroupStatusRequest, DescribeContainerGroupsRequest, EnvironmentVar, FieldRef,
    Tag,
};
use eci_proto::v20180808::{
    CreateImageCacheRequest, DeleteImageCacheRequest, DescribeImageCachesRequest,
    UpdateImageCacheRequest,
};
use mock_eci::{MockConfig, MockServer};
use virtual_node_eci::eci::openapi::credentials::{CredentialSource, Credentials, Secret};
use virtual_node_eci::eci::openapi::{OpenApiBackend, OpenApiOptions};
use virtual_node_eci::eci::{EciBackend, ImageCacheBackend};

const KEY_ID: &str = "LTAI-test-id";
const SECRET: &str = "a-secret-that-must-never-travel";

struct Fixture {
    server: MockServer,
    ca: tempfile::NamedTempFile,
}

impl Fixture {
    async fn start(security_token: Option<&str>) -> Self {
        let mut config = MockConfig::defaults();
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.openapi_listen = Some("127.0.0.1:0".parse().unwrap());
        config.openapi_access_key_id = KEY_ID.into();
        config.openapi_access_key_secret = SECRET.into();
        config.openapi_security_token = security_token.map(str::to_owned);
        config.no_rate_limits = true;
        config.image_cache_creation_delay = "300ms".parse().unwrap();
        let server = MockServer::start(config).await.expect("mock-eci starts");
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca.path(), server.openapi().unwrap().ca_pem()).unwrap();
        Self { server, ca }
    }

    fn client_with(&self, secret: &str, token: Option<&str>) -> OpenApiBackend {
        let options = OpenApiOptions {
            endpoint: self.server.openapi().unwrap().endpoint(),
            timeout: Duration::from_secs(10),
            ca_file: Some(self.ca.path().to_owned()),
        };
        let credentials = CredentialSource::Static(Credentials {
            access_key_id: KEY_ID.into(),
            access_key_secret: Secret::new(secret),
            security_token: token.map(Secret::new),
        });
        OpenApiBackend::new(&options, credentials).expect("client builds")
    }

    fn client(&self) -> OpenApiBackend {
        self.client_with(SECRET, None)
    }

    fn last_params(&self) -> BTreeMap<String, String> {
        let recorded = self.server.openapi().unwrap().recorded();
        recorded.last().unwrap().params.iter().cloned().collect()
    }

    fn patch(&self, patch: serde_json::Value) {
        self.server
            .mock()
            .patch_controls(&serde_json::from_value(patch).unwrap())
            .unwrap();
    }
}

fn mk_request(name: &str, token: &str, tags: &[(&str, &str)]) -> CreateContainerGroupRequest {
    CreateContainerGroupRequest {
        region_id: "cn-hangzhou".into(),
        security_group_id: "sg-1".into(),
        v_switch_id: "vsw-1".into(),
        container_group_name: name.into(),
        restart_policy: "Always".into(),
        cpu: Some(2.0),
        memory: Some(4.0),
        client_token: token.into(),
        tag: tags
            .iter()
            .map(|(k, v)| Tag {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        container: vec![Container {
            name: "app".into(),
            image: "nginx:1.27".into(),
            environment_var: vec![
                EnvironmentVar {
                    key: "GREETING".into(),
                    value: "a b*~/é".into(),
                    field_ref: None,
                },
                EnvironmentVar {
                    key: "POD_IP".into(),
                    value: String::new(),
                    field_ref: Some(FieldRef {
                        field_path: "status.podIP".into(),
                    }),
                },
            ],
            ..Container::default()
        }],
        ..CreateContainerGroupRequest::default()
    }
}

#[tokio::test]
async fn a_group_lives_and_dies_through_signed_requests() {
    let fixture = Fixture::start(None).await;
    let client = fixture.client();
    let created = client
        .create_container_group(mk_request("default-web-0", "uid-1", &[("cluster", "c1")]))
        .await
        .expect("created");
    assert!(
        created.container_group_id.starts_with("eci-"),
        "{created:?}"
    );
    assert!(!created.request_id.is_empty());

    // What travelled: the flattened names, the common parameters, never the secret.
    let sent = fixture.last_params();
    assert_eq!(sent["Action"], "CreateContainerGroup");
    assert_eq!(sent["Version"], "2018-08-08");
    assert_eq!(sent["SignatureMethod"], "HMAC-SHA1");
    assert_eq!(sent["Container.1.EnvironmentVar.1.Value"], "a b*~/é");
    assert_eq!(
        sent["Container.1.EnvironmentVar.2.FieldRef.FieldPath"],
        "status.podIP"
    );
    assert_eq!(sent["Tag.1.Key"], "cluster");
    assert!(sent.values().all(|v| !v.contains(SECRET)));
    assert!(!format!("{client:?}").contains(SECRET));

    // The group as the mock holds it carries exactly what was sent.
    let held = fixture.server.mock().groups();
    let env = &held[0].containers[0].environment_vars;
    assert_eq!(env[0].value, "a b*~/é");
    assert_eq!(
        env[1].field_ref.as_ref().unwrap().field_path,
        "status.podIP"
    );

    // Retrying with the same ClientToken is idempotent.
    let again = client
        .create_container_group(mk_request("default-web-0", "uid-1", &[("cluster", "c1")]))
        .await
        .unwrap();
    assert_eq!(again.container_group_id, created.container_group_id);

    // The incremental poll: the service's status shape, completed with tags and containers.
    let status = client
        .describe_container_group_status(DescribeContainerGroupStatusRequest {
            region_id: "cn-hangzhou".into(),
            since_second: Some(60),
            tag: vec![Tag {
                key: "cluster".into(),
                value: "c1".into(),
            }],
            ..DescribeContainerGroupStatusRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(status.data.len(), 1);
    let group = &status.data[0];
    assert_eq!(group.container_group_id, created.container_group_id);
    assert_eq!(group.tags[0].value, "c1");
    assert_eq!(group.containers[0].name, "app");
    let actions: Vec<String> = fixture
        .server
        .openapi()
        .unwrap()
        .recorded()
        .iter()
        .rev()
        .take(2)
        .filter_map(|r| {
            r.params
                .iter()
                .find(|(k, _)| k == "Action")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(
        actions,
        ["DescribeContainerGroups", "DescribeContainerGroupStatus"]
    );
    assert_eq!(
        fixture.last_params()["ContainerGroupIds"],
        format!("[\"{}\"]", created.container_group_id)
    );

    client
        .delete_container_group(DeleteContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: created.container_group_id.clone(),
            client_token: "delete-uid-1".into(),
            force: true,
        })
        .await
        .unwrap();
    let error = client
        .delete_container_group(DeleteContainerGroupRequest {
            region_id: "cn-hangzhou".into(),
            container_group_id: "eci-does-not-exist".into(),
            client_token: String::new(),
            force: true,
        })
        .await
        .unwrap_err();
    assert!(error.is_not_found(), "{error}");
    assert!(!error.request_id.is_empty());
}

#[tokio::test]
async fn listings_page_by_twenty() {
    let fixture = Fixture::start(None).await;
    let client = fixture.client();
    for i in 0..45 {
        client
            .create_container_group(mk_request(
                &format!("pod-{i}"),
                &format!("uid-{i}"),
                &[("node", "vn-0")],
            ))
            .await
            .unwrap();
    }
    client
        .create_container_group(mk_request("other", "uid-x", &[("node", "vn-1")]))
        .await
        .unwrap();
    let mut pages = 0;
    let mut seen = Vec::new();
    let mut next_token = String::new();
    loop {
        let page = client
            .describe_container_group_status(DescribeContainerGroupStatusRequest {
                region_id: "cn-hangzhou".into(),
                tag: vec![Tag {
                    key: "node".into(),
                    value: "vn-0".into(),
                }],
                limit: Some(200),
                next_token: next_token.clone(),
                ..DescribeContainerGroupStatusRequest::default()
            })
            .await
            .unwrap();
        pages += 1;
        assert_eq!(page.total_count, 45);
        seen.extend(page.data.into_iter().map(|g| g.container_group_name));
        if page.next_token.is_empty() {
            break;
        }
        next_token = page.next_token;
    }
    assert_eq!(pages, 3);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 45);
    assert!(!seen.contains(&"other".to_owned()));
    assert_eq!(fixture.last_params()["Limit"], "20");
}

#[tokio::test]
async fn errors_keep_the_service_code_message_and_request_id() {
    let fixture = Fixture::start(None).await;
    let client = fixture.client();

    // Throttling, then success once it passes: retryable, and the retry creates one group.
    fixture.patch(serde_json::json!({"faults": {"CreateContainerGroup": {"error_rate": 1.0, "error_code": "Throttling.User"}}}));
    let error = client
        .create_container_group(mk_request("web", "uid-t", &[]))
        .await
        .unwrap_err();
    assert_eq!(error.code, "Throttling.User");
    assert!(error.is_throttling() && error.is_retryable());
    assert!(!error.request_id.is_empty());
    fixture.patch(serde_json::json!({"faults": {"CreateContainerGroup": {"error_rate": 0.0}}}));
    client
        .create_container_group(mk_request("web", "uid-t", &[]))
        .await
        .unwrap();
    assert_eq!(fixture.server.mock().group_count(), 1);

    // A request the service refuses for good.
    let error = client
        .create_container_group(mk_request("Not_A_Valid_Name", "uid-bad", &[]))
        .await
        .unwrap_err();
    assert_eq!(error.code, "InvalidParameter.ContainerGroupName");
    assert!(!error.is_retryable());
    assert!(!error.message.is_empty() && !error.request_id.is_empty());
    assert!(error.to_string().contains(&error.request_id));

    // The wrong secret: refused before anything is done, and the hint names the fix.
    let error = fixture
        .client_with("not-the-secret", None)
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: "cn-hangzhou".into(),
            ..DescribeContainerGroupsRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(error.code, "SignatureDoesNotMatch");
    assert!(!error.is_retryable());
    assert!(error.message.contains("ECI_SECRET_KEY"), "{error}");
    assert!(!error.message.contains(SECRET) && !error.message.contains("not-the-secret"));

    // An outage: the service's own 503, retryable.
    fixture.patch(serde_json::json!({"outage": true}));
    let error = client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: "cn-hangzhou".into(),
            ..DescribeContainerGroupsRequest::default()
        })
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
}

#[tokio::test]
async fn sts_tokens_are_required_when_the_key_is_temporary() {
    let fixture = Fixture::start(Some("sts-token")).await;
    let request = DescribeContainerGroupsRequest {
        region_id: "cn-hangzhou".into(),
        ..DescribeContainerGroupsRequest::default()
    };
    fixture
        .client_with(SECRET, Some("sts-token"))
        .describe_container_groups(request.clone())
        .await
        .unwrap();
    assert_eq!(fixture.last_params()["SecurityToken"], "sts-token");
    let error = fixture
        .client()
        .describe_container_groups(request)
        .await
        .unwrap_err();
    assert!(error.code.starts_with("InvalidSecurityToken"), "{error}");
    assert!(error.message.contains("ECI_SECURITY_TOKEN"), "{error}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_a_retryable_error_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let options = OpenApiOptions {
        endpoint: format!("https://127.0.0.1:{port}"),
        timeout: Duration::from_secs(2),
        ca_file: None,
    };
    let client = OpenApiBackend::new(
        &options,
        CredentialSource::Static(Credentials {
            access_key_id: KEY_ID.into(),
            access_key_secret: Secret::new(SECRET),
            security_token: None,
        }),
    )
    .unwrap();
    let error = client
        .describe_container_groups(DescribeContainerGroupsRequest::default())
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error}");
    assert!(
        error.message.contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
}

/// Every answer that means "misconfigured" reaches the daemon with its code over both
/// backends, and is judged the node's problem (`eci::misconfig`), not the request's.
#[tokio::test]
async fn misconfiguration_answers_arrive_alike_over_openapi_and_grpc() {
    use virtual_node_eci::eci::GrpcBackend;
    use virtual_node_eci::eci::misconfig::{ErrorClass, Problem, classify};
    let fixture = Fixture::start(None).await;
    let openapi = fixture.client();
    let grpc = GrpcBackend::connect_lazy(&fixture.server.endpoint()).unwrap();
    let request = DescribeContainerGroupsRequest {
        region_id: "cn-hangzhou".into(),
        ..DescribeContainerGroupsRequest::default()
    };
    for (code, problem) in [
        ("Forbidden.RAM", Problem::Permission),
        ("Forbidden.NoPermission", Problem::Permission),
        ("InvalidAccessKeyId.NotFound", Problem::Credentials),
        ("InvalidAccessKeyId.Inactive", Problem::Credentials),
        ("SignatureDoesNotMatch", Problem::Credentials),
        ("InvalidTimeStamp.Expired", Problem::ClockSkew),
        ("Account.Arrearage", Problem::Account),
        ("SDK.ForeignResponse", Problem::NotEci),
    ] {
        fixture
            .patch(serde_json::json!({"faults": {"*": {"error_rate": 1.0, "error_code": code}}}));
        let over_openapi = openapi
            .describe_container_groups(request.clone())
            .await
            .unwrap_err();
        let over_grpc = grpc
            .describe_container_groups(request.clone())
            .await
            .unwrap_err();
        for (front, error) in [("openapi", &over_openapi), ("grpc", &over_grpc)] {
            assert_eq!(error.code, code, "{front}: {error}");
            assert_eq!(
                classify(error),
                ErrorClass::Configuration(problem),
                "{front}: {error}"
            );
        }
        if code == "SDK.ForeignResponse" {
            assert!(over_openapi.message.contains("HTTP 403"), "{over_openapi}");
            assert!(over_grpc.request_id.is_empty(), "no service answered");
        } else {
            assert!(!over_openapi.request_id.is_empty(), "{over_openapi}");
        }
    }
    fixture.patch(serde_json::json!({"faults": {"*": {"error_rate": 0.0}}}));
    openapi
        .describe_container_groups(request.clone())
        .await
        .unwrap();
    grpc.describe_container_groups(request).await.unwrap();
}

/// An incremental poll over many changed groups describes them 20 ids a call: pages throttled
/// by the service (here DescribeContainerGroups allows 2 at once, then 10 a second) are
/// fetched again after a back-off, and the poll answers with every group instead of failing
/// on the first throttled page.
#[tokio::test]
async fn a_throttled_page_is_retried_not_the_whole_poll_dropped() {
    let fixture = Fixture::start(None).await;
    let client = fixture.client();
    for i in 0..100 {
        client
            .create_container_group(mk_request(
                &format!("pod-{i}"),
                &format!("uid-{i}"),
                &[("node", "vn-0")],
            ))
            .await
            .unwrap();
    }
    fixture.patch(serde_json::json!({
        "rate_limits_enabled": true,
        "rate_limits": {"DescribeContainerGroups": {"per_minute": 600, "burst": 2}},
    }));
    let status = client
        .describe_container_group_status(DescribeContainerGroupStatusRequest {
            region_id: "cn-hangzhou".into(),
            since_second: Some(600),
            tag: vec![Tag {
                key: "node".into(),
                value: "vn-0".into(),
            }],
            limit: Some(200),
            ..DescribeContainerGroupStatusRequest::default()
        })
        .await
        .expect("throttled pages are fetched again");
    assert_eq!(status.data.len(), 100);
    assert!(
        status.data.iter().all(|g| !g.containers.is_empty()),
        "every group completed by its DescribeContainerGroups page"
    );
    let throttled = fixture
        .server
        .openapi()
        .unwrap()
        .recorded()
        .iter()
        .filter(|r| {
            r.params
                .iter()
                .any(|(k, v)| k == "Action" && v == "DescribeContainerGroups")
        })
        .count();
    assert!(
        throttled > 5,
        "5 pages of 20 ids, some of them asked again: {throttled} calls"
    );
}

/// DescribeImageCaches of `id` until its status is `wanted` (10 s at most).
async fn cache_reaches(client: &OpenApiBackend, id: &str, wanted: &str) -> String {
    let request = DescribeImageCachesRequest {
        region_id: "cn-hangzhou".into(),
        image_cache_id: id.into(),
        ..DescribeImageCachesRequest::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = client.describe_image_caches(request.clone()).await.unwrap();
        let status = answer.image_caches.first().map(|c| c.status.clone());
        if status.as_deref() == Some(wanted) || tokio::time::Instant::now() > deadline {
            return status.unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_image_cache_lives_and_dies_through_signed_requests() {
    let fixture = Fixture::start(None).await;
    let client = fixture.client();
    let created = client
        .create_image_cache(CreateImageCacheRequest {
            region_id: "cn-hangzhou".into(),
            image_cache_name: "web".into(),
            image: vec!["nginx:1.27".into(), "redis:7".into()],
            retention_days: Some(3),
            client_token: "imc-token".into(),
            ..CreateImageCacheRequest::default()
        })
        .await
        .expect("created");
    let id = created.image_cache_id;
    assert!(id.starts_with("imc-"), "{id}");
    let sent = fixture.last_params();
    assert_eq!(sent["Action"], "CreateImageCache");
    assert_eq!(
        (sent["Image.1"].as_str(), sent["Image.2"].as_str()),
        ("nginx:1.27", "redis:7")
    );
    assert_eq!(cache_reaches(&client, &id, "Ready").await, "Ready");

    // A group named after the cache starts from it, and says so.
    let mut group = mk_request("default-cached-0", "uid-cached", &[]);
    group.image_snapshot_id = id.clone();
    let group = client.create_container_group(group).await.unwrap();
    assert_eq!(fixture.last_params()["ImageSnapshotId"], id);
    let described = client
        .describe_container_groups(DescribeContainerGroupsRequest {
            region_id: "cn-hangzhou".into(),
            container_group_ids: vec![group.container_group_id.clone()],
            with_event: true,
            ..DescribeContainerGroupsRequest::default()
        })
        .await
        .unwrap();
    let events = &described.container_groups[0].events;
    assert!(
        events
            .iter()
            .any(|e| e.reason == eci_proto::events::HIT_IMAGE_CACHE
                && eci_proto::events::hit_image_cache_id(&e.message) == Some(id.as_str())),
        "{events:?}"
    );

    client
        .update_image_cache(UpdateImageCacheRequest {
            region_id: "cn-hangzhou".into(),
            image_cache_id: id.clone(),
            image_cache_name: "web-2".into(),
            image: vec!["nginx:1.28".into()],
            ..UpdateImageCacheRequest::default()
        })
        .await
        .expect("updated");
    assert_eq!(cache_reaches(&client, &id, "Ready").await, "Ready");
    let listed = client
        .describe_image_caches(DescribeImageCachesRequest {
            region_id: "cn-hangzhou".into(),
            match_image: vec!["nginx:1.28".into()],
            ..DescribeImageCachesRequest::default()
        })
        .await
        .unwrap();
    let cache = &listed.image_caches[0];
    assert_eq!(
        (cache.image_cache_name.as_str(), cache.images.clone()),
        ("web-2", vec!["nginx:1.28".to_owned()])
    );
    assert!(!cache.expire_date_time.is_empty() && !cache.events.is_empty());

    let delete = DeleteImageCacheRequest {
        region_id: "cn-hangzhou".into(),
        image_cache_id: id.clone(),
        client_token: String::new(),
    };
    client
        .delete_image_cache(delete.clone())
        .await
        .expect("deleted");
    let again = client.delete_image_cache(delete).await.unwrap_err();
    assert_eq!(again.code, "InvalidImageCache.NotFound", "{again:?}");
    assert!(!again.request_id.is_empty());
}
