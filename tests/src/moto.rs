//! moto's server (PyPI `moto[server]` 5.2) on 127.0.0.1 as the SSM Parameter Store, Secrets
//! Manager, EC2 and S3 of the tests, with helpers that seed it through raw HTTP.
//!
//! The helpers speak the AWS JSON 1.1 protocol (`POST /`, `X-Amz-Target`,
//! `Content-Type: application/x-amz-json-1.1`) over a plain `TcpStream`. moto checks no
//! signature, but it picks the service from the credential scope of the `Authorization`
//! header (without one, every request goes to S3), so a fake SigV4 header naming the
//! service is sent.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::process::{free_port, wait_until, Daemon, TempRoot};

/// The region the tests use.
pub const REGION: &str = "us-east-1";

/// How long moto gets to answer after start (about 1 s here).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Deadline of one request to moto.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How often moto is started on a new port when it cannot bind the picked one.
const START_ATTEMPTS: u32 = 3;

/// A moto server for one test, stopped on drop.
#[derive(Debug)]
pub struct Moto {
    daemon: Daemon,
    port: u16,
    _root: TempRoot,
}

/// A response from moto: HTTP status and JSON body (`Value::Null` when empty).
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body parsed as JSON.
    pub body: Value,
}

impl Moto {
    /// Starts `moto_server -H 127.0.0.1 -p <free port>` and waits until it answers.
    pub fn start() -> Result<Moto> {
        Self::start_with_env(&[])
    }

    /// Like [`Moto::start`], with extra environment for the server, e.g.
    /// `INITIAL_NO_AUTH_ACTION_COUNT` to make moto enforce IAM after that many actions.
    pub fn start_with_env(env: &[(&str, &str)]) -> Result<Moto> {
        let root = TempRoot::new("slurm-e2e-moto-")?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            let mut cmd = Command::new("moto_server");
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .envs(env.iter().copied());
            let mut daemon = Daemon::spawn(&format!("moto-{attempt}"), cmd, root.path())?;
            let ready = wait_until(
                "moto to answer",
                START_TIMEOUT,
                Duration::from_millis(50),
                || {
                    daemon.check_running()?;
                    Ok(http(port, "GET", "/moto-api/data.json", &[], b"")
                        .ok()
                        .filter(|(status, _)| *status == 200)
                        .map(|_| ()))
                },
            );
            match ready {
                Ok(()) => {
                    return Ok(Moto {
                        daemon,
                        port,
                        _root: root,
                    })
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("moto was not started")))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The daemon guard (pid, log).
    pub fn daemon(&mut self) -> &mut Daemon {
        &mut self.daemon
    }

    /// The environment an AWS SDK client needs to use this server: `AWS_ENDPOINT_URL`,
    /// `AWS_ACCESS_KEY_ID=testing`, `AWS_SECRET_ACCESS_KEY=testing`, `AWS_REGION` and
    /// `AWS_DEFAULT_REGION` (`us-east-1`). IMDS is left enabled (the agent reads it).
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ("AWS_REGION".into(), REGION.into()),
            ("AWS_DEFAULT_REGION".into(), REGION.into()),
        ]
    }

    /// One AWS JSON 1.1 call: `service` is the SigV4 signing name (`ssm`,
    /// `secretsmanager`), `target` the `X-Amz-Target` (`AmazonSSM.PutParameter`). Any
    /// HTTP status is returned; only transport errors are errors.
    pub fn call(&self, service: &str, target: &str, body: &Value) -> Result<Response> {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20240101/{REGION}/{service}/aws4_request, \
             SignedHeaders=content-type;host;x-amz-target, Signature=0"
        );
        let payload = serde_json::to_vec(body).context("encoding a request body")?;
        let (status, bytes) = http(
            self.port,
            "POST",
            "/",
            &[
                ("Content-Type", "application/x-amz-json-1.1"),
                ("X-Amz-Target", target),
                ("Authorization", &auth),
            ],
            &payload,
        )
        .with_context(|| format!("calling {target} on moto at {}", self.endpoint()))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{target}: moto answered {status} with a body that is not JSON: {}",
                    String::from_utf8_lossy(&bytes)
                )
            })?
        };
        Ok(Response { status, body })
    }

    /// Like [`Moto::call`], but a status other than 200 is an error with the body.
    pub fn call_ok(&self, service: &str, target: &str, body: &Value) -> Result<Value> {
        let r = self.call(service, target, body)?;
        if r.status != 200 {
            bail!("{target} failed: HTTP {}: {}", r.status, r.body);
        }
        Ok(r.body)
    }

    /// Creates an IAM user with no policy at all and an access key for it (IAM's Query
    /// API): `(AccessKeyId, SecretAccessKey)`. With a moto started with
    /// `INITIAL_NO_AUTH_ACTION_COUNT`, these two calls count as two actions, and every
    /// call signed with the key is then denied.
    pub fn create_user_without_permissions(&self, user: &str) -> Result<(String, String)> {
        self.iam(&format!("Action=CreateUser&UserName={user}"))?;
        let key = self.iam(&format!("Action=CreateAccessKey&UserName={user}"))?;
        Ok((
            xml_value(&key, "AccessKeyId")?,
            xml_value(&key, "SecretAccessKey")?,
        ))
    }

    /// `iam:CreateUser` `user`, `iam:PutUserPolicy` with `policy` (a policy document, JSON)
    /// and `iam:CreateAccessKey`: the access key id and secret. Three actions (count them in
    /// `INITIAL_NO_AUTH_ACTION_COUNT`): with IAM enforced, the user may do what the policy
    /// allows.
    ///
    /// # Errors
    /// When moto refuses a call.
    pub fn create_user_with_policy(&self, user: &str, policy: &str) -> Result<(String, String)> {
        self.iam(&format!("Action=CreateUser&UserName={user}"))?;
        self.iam(&format!(
            "Action=PutUserPolicy&UserName={user}&PolicyName={user}-policy&PolicyDocument={}",
            form_encode(policy)
        ))?;
        let key = self.iam(&format!("Action=CreateAccessKey&UserName={user}"))?;
        Ok((
            xml_value(&key, "AccessKeyId")?,
            xml_value(&key, "SecretAccessKey")?,
        ))
    }

    /// One IAM Query API call (form-encoded); returns the XML body of a 200.
    fn iam(&self, params: &str) -> Result<String> {
        self.query("iam", &format!("{params}&Version=2010-05-08"))
    }

    /// One EC2 Query API call (form-encoded `Action=...&...`, values already URL-encoded);
    /// returns the XML body of a 200.
    pub fn ec2(&self, params: &str) -> Result<String> {
        self.query("ec2", &format!("{params}&Version=2016-11-15"))
    }

    /// An Auto Scaling group `group` of one instance (from a launch configuration of
    /// `image`, `us-east-1a`) with the termination lifecycle hook `hook`
    /// (`autoscaling:EC2_INSTANCE_TERMINATING`, `HeartbeatTimeout` `timeout_s`,
    /// `DefaultResult` `ABANDON`): the instance's id. Query protocol, Auto Scaling's
    /// `Version=2011-01-01`.
    pub fn autoscaling_group_with_hook(
        &self,
        group: &str,
        hook: &str,
        timeout_s: u32,
        image: &str,
    ) -> Result<String> {
        let asg =
            |params: String| self.query("autoscaling", &format!("{params}&Version=2011-01-01"));
        let (group, hook) = (form_encode(group), form_encode(hook));
        asg(format!(
            "Action=CreateLaunchConfiguration&LaunchConfigurationName={group}-lc\
             &ImageId={image}&InstanceType=t3.micro"
        ))?;
        asg(format!(
            "Action=CreateAutoScalingGroup&AutoScalingGroupName={group}\
             &LaunchConfigurationName={group}-lc&MinSize=0&MaxSize=1&DesiredCapacity=1\
             &AvailabilityZones.member.1=us-east-1a"
        ))?;
        asg(format!(
            "Action=PutLifecycleHook&AutoScalingGroupName={group}&LifecycleHookName={hook}\
             &LifecycleTransition=autoscaling%3AEC2_INSTANCE_TERMINATING\
             &HeartbeatTimeout={timeout_s}&DefaultResult=ABANDON"
        ))?;
        let body = asg(format!(
            "Action=DescribeAutoScalingGroups&AutoScalingGroupNames.member.1={group}"
        ))?;
        xml_value(&body, "InstanceId")
    }

    /// `ec2:RegisterImage` named `name`: the new image's id (`ami-` and 17 hex digits),
    /// `available` at once in moto.
    pub fn register_image(&self, name: &str) -> Result<String> {
        let body = self.ec2(&format!(
            "Action=RegisterImage&Name={name}&RootDeviceName=%2Fdev%2Fxvda&Architecture=x86_64"
        ))?;
        xml_value(&body, "imageId")
    }

    /// `ec2:CreateLaunchTemplate` named `name` launching `image` (`m5.large`): its id.
    pub fn create_launch_template(&self, name: &str, image: &str) -> Result<String> {
        let body = self.ec2(&format!(
            "Action=CreateLaunchTemplate&LaunchTemplateName={name}\
             &LaunchTemplateData.ImageId={image}&LaunchTemplateData.InstanceType=m5.large"
        ))?;
        xml_value(&body, "launchTemplateId")
    }

    /// `ec2:DescribeLaunchTemplateVersions` of version `version` (`$Default`, `$Latest`, a
    /// number) of template `name`: `(version number, image id)`.
    pub fn launch_template_version(&self, name: &str, version: &str) -> Result<(u64, String)> {
        let v = version.replace('$', "%24");
        let body = self.ec2(&format!(
            "Action=DescribeLaunchTemplateVersions&LaunchTemplateName={name}&LaunchTemplateVersion.1={v}"
        ))?;
        let number = xml_value(&body, "versionNumber")?
            .parse()
            .with_context(|| format!("versionNumber in {body}"))?;
        Ok((number, xml_value(&body, "imageId")?))
    }

    /// `ec2:RunInstances` of one `t3.micro` from `image`: the instance's id.
    pub fn run_instance(&self, image: &str) -> Result<String> {
        let body = self.ec2(&format!(
            "Action=RunInstances&ImageId={image}&InstanceType=t3.micro&MinCount=1&MaxCount=1"
        ))?;
        xml_value(&body, "instanceId")
    }

    /// `ec2:CreateTags` on `resource` (an instance id): keys and values as given (`/`,
    /// spaces and any other character are percent-encoded here).
    pub fn create_tags(&self, resource: &str, tags: &[(&str, &str)]) -> Result<()> {
        let mut params = format!("Action=CreateTags&ResourceId.1={}", url_encode(resource));
        for (i, (k, v)) in tags.iter().enumerate() {
            let n = i + 1;
            params.push_str(&format!(
                "&Tag.{n}.Key={}&Tag.{n}.Value={}",
                url_encode(k),
                url_encode(v)
            ));
        }
        self.ec2(&params)?;
        Ok(())
    }

    /// One Query API call of `service` (its SigV4 signing name); `params` must hold
    /// `Version=`.
    fn query(&self, service: &str, params: &str) -> Result<String> {
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20240101/{REGION}/{service}/aws4_request, \
             SignedHeaders=host, Signature=0"
        );
        let (status, body) = http(
            self.port,
            "POST",
            "/",
            &[
                ("Content-Type", "application/x-www-form-urlencoded"),
                ("Authorization", &auth),
            ],
            params.as_bytes(),
        )?;
        let body = String::from_utf8_lossy(&body).into_owned();
        if status != 200 {
            bail!("{service} {params}: HTTP {status}: {body}");
        }
        Ok(body)
    }

    /// `ssm:PutParameter` with `Type=SecureString`, overwriting.
    pub fn put_secure_string(&self, name: &str, value: &str) -> Result<()> {
        self.put_parameter(name, value, "SecureString")
    }

    /// `ssm:PutParameter` of `kind` (`String`, `StringList`, `SecureString`), overwriting.
    pub fn put_parameter(&self, name: &str, value: &str, kind: &str) -> Result<()> {
        self.call_ok(
            "ssm",
            "AmazonSSM.PutParameter",
            &json!({"Name": name, "Value": value, "Type": kind, "Overwrite": true}),
        )?;
        Ok(())
    }

    /// `ssm:GetParameter` with decryption: the value, or `None` when it does not exist.
    pub fn get_parameter(&self, name: &str) -> Result<Option<String>> {
        let r = self.call(
            "ssm",
            "AmazonSSM.GetParameter",
            &json!({"Name": name, "WithDecryption": true}),
        )?;
        if r.status == 400 && r.body["__type"] == "ParameterNotFound" {
            return Ok(None);
        }
        if r.status != 200 {
            bail!("GetParameter {name} failed: HTTP {}: {}", r.status, r.body);
        }
        r.body["Parameter"]["Value"]
            .as_str()
            .map(|v| Some(v.to_string()))
            .with_context(|| format!("GetParameter {name}: no Parameter.Value in {}", r.body))
    }

    /// `secretsmanager:CreateSecret` with `SecretString`.
    pub fn create_secret_string(&self, name: &str, value: &str) -> Result<()> {
        self.call_ok(
            "secretsmanager",
            "secretsmanager.CreateSecret",
            &json!({"Name": name, "SecretString": value}),
        )?;
        Ok(())
    }

    /// `secretsmanager:CreateSecret` with `SecretBinary` (sent base64-encoded, as the
    /// protocol wants; a client gets the bytes back).
    pub fn create_secret_binary(&self, name: &str, value: &[u8]) -> Result<()> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(value);
        self.call_ok(
            "secretsmanager",
            "secretsmanager.CreateSecret",
            &json!({"Name": name, "SecretBinary": b64}),
        )?;
        Ok(())
    }

    /// `secretsmanager:GetSecretValue`: the whole response (`SecretString` or
    /// `SecretBinary` in base64), or `None` when it does not exist.
    pub fn get_secret_value(&self, name: &str) -> Result<Option<Value>> {
        let r = self.call(
            "secretsmanager",
            "secretsmanager.GetSecretValue",
            &json!({"SecretId": name}),
        )?;
        if matches!(r.status, 400 | 404) && r.body["__type"] == "ResourceNotFoundException" {
            return Ok(None);
        }
        if r.status != 200 {
            bail!(
                "GetSecretValue {name} failed: HTTP {}: {}",
                r.status,
                r.body
            );
        }
        Ok(Some(r.body))
    }

    /// `s3:CreateBucket` (path style, `PUT /<bucket>`, in [`REGION`]); with `versioned`,
    /// then `s3:PutBucketVersioning` `Enabled`.
    pub fn create_bucket(&self, bucket: &str, versioned: bool) -> Result<()> {
        self.s3("PUT", &format!("/{bucket}"), b"")?;
        if versioned {
            self.s3(
                "PUT",
                &format!("/{bucket}?versioning"),
                b"<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                  <Status>Enabled</Status></VersioningConfiguration>",
            )?;
        }
        Ok(())
    }

    /// `s3:PutBucketPolicy`: `policy` (a JSON policy document) on `bucket`. moto enforces a
    /// `Deny` on `s3:GetObject` with an HTTP 403 without a body.
    pub fn put_bucket_policy(&self, bucket: &str, policy: &Value) -> Result<()> {
        let body = serde_json::to_vec(policy).context("encoding a bucket policy")?;
        let (status, _, out) = request(
            self.port,
            "PUT",
            &format!("/{bucket}?policy"),
            &[("Authorization", &self.s3_auth())],
            &body,
        )?;
        // S3 answers 204 No Content.
        if !matches!(status, 200 | 204) {
            bail!(
                "S3 PutBucketPolicy {bucket}: HTTP {status}: {}",
                String::from_utf8_lossy(&out)
            );
        }
        Ok(())
    }

    /// `s3:PutObject` of `body` at `bucket`/`key` (`key` without characters that need
    /// percent-encoding): the new version's id (`x-amz-version-id`) in a versioned bucket.
    pub fn put_object(&self, bucket: &str, key: &str, body: &[u8]) -> Result<Option<String>> {
        let headers = self.s3("PUT", &format!("/{bucket}/{key}"), body)?;
        Ok(headers
            .into_iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("x-amz-version-id"))
            .map(|(_, v)| v)
            .filter(|v| v != "null"))
    }

    /// One S3 REST call (path style) with a fake SigV4 header for `s3` (moto treats an
    /// unsigned request as anonymous and refuses to overwrite an object for it); a status
    /// other than 200 is an error with the body. Returns the response headers.
    fn s3(&self, method: &str, path: &str, body: &[u8]) -> Result<Vec<(String, String)>> {
        let (status, headers, out) = request(
            self.port,
            method,
            path,
            &[("Authorization", &self.s3_auth())],
            body,
        )?;
        if status != 200 {
            bail!(
                "S3 {method} {path}: HTTP {status}: {}",
                String::from_utf8_lossy(&out)
            );
        }
        Ok(headers)
    }

    /// A fake SigV4 `Authorization` header for `s3` (moto checks no signature).
    fn s3_auth(&self) -> String {
        format!(
            "AWS4-HMAC-SHA256 Credential=testing/20240101/{REGION}/s3/aws4_request, \
             SignedHeaders=host, Signature=0"
        )
    }

    /// Clears every stored resource (`POST /moto-api/reset`).
    pub fn reset(&self) -> Result<()> {
        let (status, body) = http(self.port, "POST", "/moto-api/reset", &[], b"")?;
        if status != 200 {
            bail!(
                "moto reset failed: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(())
    }

    /// The log file of the server.
    pub fn log_path(&self) -> &Path {
        self.daemon.log_path()
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with `Connection: close`; returns the status
/// and the body (chunked bodies are decoded).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Vec<u8>)> {
    let (status, _, body) = request(port, method, path, headers, body)?;
    Ok((status, body))
}

/// `(status, headers, body)` of an HTTP/1.1 response; headers as `(name, value)` as sent.
pub type Parsed = (u16, Vec<(String, String)>, Vec<u8>);

/// Like [`http`], also returning the response headers.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Parsed> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        if k.contains(['\r', '\n']) || v.contains(['\r', '\n']) {
            bail!("HTTP header {k:?} contains a line break");
        }
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .with_context(|| format!("reading the answer to {method} {path}"))?;
    parse_response(&raw).with_context(|| format!("parsing the answer to {method} {path}"))
}

fn parse_response(raw: &[u8]) -> Result<Parsed> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).context("headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("no status line")?;
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    });
    let body = &raw[end + 4..];
    if !chunked {
        return Ok((status, headers, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let nl = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk header")?;
        let size_text = std::str::from_utf8(&rest[..nl]).context("bad chunk size")?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[nl + 2..];
        if size == 0 {
            return Ok((status, headers, out));
        }
        if rest.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// `s` percent-encoded for a form body (everything but unreserved characters).
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of the first `<tag>...</tag>` in an XML answer.
fn xml_value(xml: &str, tag: &str) -> Result<String> {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .with_context(|| format!("no <{tag}> in {xml}"))?
        + open.len();
    let end = xml[start..]
        .find(&format!("</{tag}>"))
        .with_context(|| format!("no </{tag}> in {xml}"))?
        + start;
    Ok(xml[start..end].to_string())
}

/// `application/x-www-form-urlencoded` value: unreserved characters as they are, every
/// other byte `%XX` (RFC 3986 section 2.3).
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len() * 3);
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_response;

    #[test]
    fn parses_plain_and_chunked_bodies() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-amz-version-id: v1\r\n\r\n{}";
        let (status, headers, body) = parse_response(plain).unwrap();
        assert_eq!((status, body), (200, b"{}".to_vec()));
        assert!(headers.contains(&("x-amz-version-id".into(), "v1".into())));
        let chunked =
            b"HTTP/1.1 400 Bad\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (status, _, body) = parse_response(chunked).unwrap();
        assert_eq!((status, body), (400, b"abcde".to_vec()));
        assert!(parse_response(b"garbage").is_err());
    }
}
