//! Whether a fixture's HTTP endpoint answers with a success: how the fixtures tell that a
//! process they started serves (etcd's `/health`, an apiserver's `/readyz`, kwok's and
//! mock-eci's `/healthz`) while polling it.

use std::time::Duration;

/// A GET of one URL that passes on a 2xx answer; cheap to clone, so each poll takes its own.
#[derive(Debug, Clone)]
pub struct HttpCheck {
    http: reqwest::Client,
    url: String,
    timeout: Option<Duration>,
}

impl HttpCheck {
    /// A check of `url` with a default client.
    pub fn new(url: String) -> Self {
        Self {
            http: reqwest::Client::new(),
            url,
            timeout: None,
        }
    }

    /// A check of `url` over HTTPS trusting `ca_pem` too. A plain client, not kube-rs, so the
    /// 500s of a starting apiserver's `/readyz` are not logged as errors.
    pub fn trusting(ca_pem: &[u8], url: String) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca_pem)?)
            .build()?;
        Ok(Self {
            http,
            url,
            timeout: None,
        })
    }

    /// Gives up on one try after `timeout` (a server that accepts but does not answer yet).
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..self
        }
    }

    /// One try: whether the endpoint answered with a success.
    pub async fn passes(self) -> bool {
        let mut request = self.http.get(&self.url);
        if let Some(timeout) = self.timeout {
            request = request.timeout(timeout);
        }
        request.send().await.is_ok_and(|r| r.status().is_success())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server on loopback that answers every request with `status`, or never answers
    /// (`None`); its URL.
    async fn server(status: Option<&'static str>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/healthz", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = socket.read(&mut buf).await;
                    match status {
                        Some(status) => {
                            let answer = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
                            let _ = socket.write_all(answer.as_bytes()).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn passes_only_on_a_success_in_time() {
        assert!(HttpCheck::new(server(Some("200 OK")).await).passes().await);
        assert!(
            !HttpCheck::new(server(Some("503 Service Unavailable")).await)
                .passes()
                .await
        );
        let silent = HttpCheck::new(server(None).await).with_timeout(Duration::from_millis(200));
        assert!(!silent.passes().await);
        let port = crate::process::free_port().unwrap();
        assert!(
            !HttpCheck::new(format!("http://127.0.0.1:{port}/healthz"))
                .passes()
                .await
        );
    }
}
