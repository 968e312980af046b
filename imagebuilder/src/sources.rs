//! Downloading pinned sources and checking their sha256 (`validate --check-sources`, and
//! `build --prefetch-sources`, which hands verified files to the build so the instance
//! need not reach the internet for them).

use crate::error::{Error, Result};
use crate::recipe::Pin;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Connecting may take this long (a silent firewall otherwise hangs for minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A whole download may take this long (the EFA installer is a few hundred MB).
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(1800);
/// Redirects followed (GitHub archive links redirect once to codeload).
const MAX_REDIRECTS: usize = 5;

/// sha256 of a file, lowercase hex.
pub async fn sha256_file(path: &Path) -> std::io::Result<String> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&path)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut HashWriter(&mut hasher))?;
        Ok(hex::encode(hasher.finalize()))
    })
    .await
    .map_err(std::io::Error::other)?
}

struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Result of one fetch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fetched {
    /// What it is.
    pub name: String,
    /// Where it came from.
    pub url: String,
    /// Where it is now.
    pub path: PathBuf,
    /// Verified sha256.
    pub sha256: String,
    /// Already in the cache with the right checksum.
    pub cached: bool,
}

/// Download `pin` into `dir` (file name from the URL), verify its sha256, and keep it.
/// A file already there with the right checksum is reused.
pub async fn fetch_verified(name: &str, pin: &Pin, dir: &Path) -> Result<Fetched> {
    let file_name = pin
        .url
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::BadInput(format!("{name}: URL '{}' names no file", pin.url)))?;
    let dest = dir.join(file_name);
    let fetched = |cached| Fetched {
        name: name.to_string(),
        url: pin.url.clone(),
        path: dest.clone(),
        sha256: pin.sha256.clone(),
        cached,
    };
    if dest.is_file() && sha256_file(&dest).await.ok().as_deref() == Some(pin.sha256.as_str()) {
        return Ok(fetched(true));
    }
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let part = dir.join(format!(".{file_name}.part"));
    let unreachable = |reason: String| Error::SourceUnreachable {
        name: name.to_string(),
        url: pin.url.clone(),
        reason,
    };
    let actual = tokio::time::timeout(DOWNLOAD_TIMEOUT, download(&pin.url, &part))
        .await
        .map_err(|_| unreachable(format!("no complete download within {DOWNLOAD_TIMEOUT:?}")))
        .and_then(|r| r.map_err(unreachable));
    let actual = match actual {
        Ok(sha) => sha,
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(e);
        }
    };
    if actual != pin.sha256 {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(Error::ChecksumMismatch {
            name: name.to_string(),
            url: pin.url.clone(),
            expected: pin.sha256.clone(),
            actual,
        });
    }
    tokio::fs::rename(&part, &dest).await.map_err(|e| {
        Error::io(
            format!("renaming {} to {}", part.display(), dest.display()),
            e,
        )
    })?;
    Ok(fetched(false))
}

/// GET `url` (following redirects) into `part`; returns the sha256 of what arrived.
async fn download(url: &str, part: &Path) -> std::result::Result<String, String> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("no TLS root certificates: {e}"))?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);

    let mut url = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let uri: hyper::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let resp = client
            .get(uri.clone())
            .await
            .map_err(|e| format!("{e} ({})", error_chain(&e)))?;
        let status = resp.status();
        if status.is_redirection() {
            let location = resp
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .ok_or_else(|| format!("HTTP {status} without a Location"))?;
            url = if location.starts_with("http://") || location.starts_with("https://") {
                location.to_string()
            } else {
                format!(
                    "{}://{}{}",
                    uri.scheme_str().unwrap_or("https"),
                    uri.authority().map(|a| a.as_str()).unwrap_or(""),
                    location
                )
            };
            continue;
        }
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        let mut file = tokio::fs::File::create(part)
            .await
            .map_err(|e| format!("creating {}: {e}", part.display()))?;
        let mut hasher = Sha256::new();
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
            if let Some(data) = frame.data_ref() {
                hasher.update(data);
                file.write_all(data)
                    .await
                    .map_err(|e| format!("writing {}: {e}", part.display()))?;
            }
        }
        file.flush()
            .await
            .map_err(|e| format!("writing {}: {e}", part.display()))?;
        return Ok(hex::encode(hasher.finalize()));
    }
    Err(format!("more than {MAX_REDIRECTS} redirects"))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}
