//! Helpers shared by the integration tests: paths, running the binary, moto, a tiny HTTP
//! file server on 127.0.0.1, free ports.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The binary under test, run from the workspace root with a clean Packer checkpoint.
pub fn sib() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slurm-image-builder"));
    cmd.current_dir(repo())
        .env("CHECKPOINT_DISABLE", "1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_PROFILE")
        .stdin(Stdio::null());
    cmd
}

/// Run and capture.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap()
}

/// stdout + stderr as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A port on 127.0.0.1 nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// moto_server on a free 127.0.0.1 port; stopped by PID (its process group) on drop.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`
    pub endpoint: String,
}

impl Moto {
    /// Start it and wait until it answers.
    pub fn start() -> Moto {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("moto_server (pip install 'moto[server]')");
        let moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..300 {
            if http_post(port, "/moto-api/reset", "").is_some() {
                return moto;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("moto_server did not answer on port {port}");
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// First AMI id of moto's `describe-images --owners amazon`, through EC2's query API.
    pub fn amazon_ami(&self) -> String {
        let body = "Action=DescribeImages&Version=2016-11-15&Owner.1=amazon";
        let resp = http_post(self.port(), "/", body).unwrap();
        let start = resp.find("<imageId>").unwrap() + "<imageId>".len();
        let end = resp[start..].find("</imageId>").unwrap() + start;
        resp[start..end].to_string()
    }

    /// Whether moto knows this image id.
    pub fn has_image(&self, ami: &str) -> bool {
        let body = format!("Action=DescribeImages&Version=2016-11-15&ImageId.1={ami}");
        http_post(self.port(), "/", &body).unwrap().contains(ami)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let pid = self.child.id() as i32;
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{pid}")])
            .status();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.0 POST to 127.0.0.1; the response text, or None when nothing answers.
pub fn http_post(port: u16, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let req = format!(
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20240101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Serves one fixed body for every GET on 127.0.0.1 (a thread; lives for the test).
pub fn serve_bytes(body: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(body);
        }
    });
    port
}

/// sha256 of bytes, hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Processes whose process group is `pgid` (from /proc).
pub fn processes_in_group(pgid: i32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...
        let Some(after) = stat.rfind(')') else {
            continue;
        };
        let fields: Vec<&str> = stat[after + 2..].split_whitespace().collect();
        if fields.get(2).and_then(|f| f.parse::<i32>().ok()) == Some(pgid)
            && fields.first() != Some(&"Z")
        {
            found.push(stat[..after + 1].to_string());
        }
    }
    found
}
