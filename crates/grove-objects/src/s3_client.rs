//! The S3 client under the `s3://BUCKET/PREFIX` backend: object_store's
//! S3 client, run on a private tokio runtime so that the API stays
//! synchronous. Endpoint and credentials come from the environment (see
//! `S3Backend::from_env`); requests are path-style, and plain http is
//! allowed to a loopback endpoint. s3.rs answers the backend's calls with
//! it, and s3_put.rs streams uploads through it.

use crate::error::{Error, ErrorKind, Result};
use crate::location::endpoint_is_loopback;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use std::sync::Arc;

/// Worker threads of the private runtime: request signing (SHA-256 of each
/// payload) is CPU work, spread over two threads.
const RUNTIME_THREADS: usize = 2;

pub(crate) struct S3Backend {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) store: Arc<AmazonS3>,
    bucket: String,
    /// "" or "a/b"
    prefix: String,
    endpoint: String,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// object_store's errors, as ours: the kind for NotFound and the
/// create-only conflicts, one line naming what was being done.
pub(crate) fn store_error(what: String, e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::NotFound,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            ErrorKind::AlreadyExists
        }
        _ => ErrorKind::Io,
    };
    Error::new(kind, format!("{what}: {e}"))
}

impl S3Backend {
    /// A client for `bucket`/`prefix` configured from AWS_ENDPOINT_URL (or
    /// AWS_ENDPOINT; AWS itself when unset), AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (optional), AWS_REGION (or
    /// AWS_DEFAULT_REGION; us-east-1 when unset). Plain http is allowed when
    /// the endpoint is on the loopback, or when AWS_ALLOW_HTTP=true.
    pub(crate) fn from_env(url: &str, bucket: String, prefix: String) -> Result<S3Backend> {
        let config = |why: String| Error::new(ErrorKind::Config, format!("{url}: {why}"));
        let key_id = env("AWS_ACCESS_KEY_ID").ok_or_else(|| {
            config("AWS_ACCESS_KEY_ID is not set (S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)".into())
        })?;
        let secret = env("AWS_SECRET_ACCESS_KEY").ok_or_else(|| {
            config("AWS_SECRET_ACCESS_KEY is not set (S3 credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)".into())
        })?;
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL").or_else(|| env("AWS_ENDPOINT"));
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&bucket)
            .with_region(&region)
            .with_access_key_id(key_id)
            .with_secret_access_key(secret)
            .with_virtual_hosted_style_request(false);
        if let Some(token) = env("AWS_SESSION_TOKEN") {
            builder = builder.with_token(token);
        }
        let shown_endpoint = match &endpoint {
            Some(endpoint) => {
                let endpoint = endpoint.trim_end_matches('/').to_string();
                let http = endpoint.starts_with("http://");
                if !http && !endpoint.starts_with("https://") {
                    return Err(config(format!(
                        "AWS_ENDPOINT_URL {endpoint:?} is not an http:// or https:// URL"
                    )));
                }
                let allow_http =
                    env("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true"));
                if http && !endpoint_is_loopback(&endpoint) && !allow_http {
                    return Err(config(format!(
                        "AWS_ENDPOINT_URL {endpoint} is plain http to a host that is not on the loopback: use https, or set AWS_ALLOW_HTTP=true"
                    )));
                }
                builder = builder.with_endpoint(&endpoint).with_allow_http(http);
                endpoint
            }
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        let store = builder
            .build()
            .map_err(|e| config(format!("cannot configure the S3 client: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("grove-objects")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(
                    ErrorKind::Io,
                    format!("{url}: cannot start the I/O runtime: {e}"),
                )
            })?;
        Ok(S3Backend {
            runtime,
            store: Arc::new(store),
            bucket,
            prefix,
            endpoint: shown_endpoint,
        })
    }

    pub(crate) fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    pub(crate) fn url(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, self.path(key))
    }

    /// "s3://bucket/prefix at http://127.0.0.1:7480", for messages.
    pub(crate) fn describe_location(&self) -> String {
        let slash = if self.prefix.is_empty() { "" } else { "/" };
        format!(
            "s3://{}{slash}{} at {}",
            self.bucket, self.prefix, self.endpoint
        )
    }

    /// The prefix every key is under, if any.
    pub(crate) fn prefix_path(&self) -> Option<Path> {
        (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()))
    }
}
