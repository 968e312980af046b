//! Helpers shared by the integration tests: paths, running the binary, a stand-in Packer,
//! moto, a tiny HTTP file server on 127.0.0.1, free ports.
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
///
/// Its Packer is the shared [`StandinPacker`] (v1.11.2, `SIB_PACKER`), with plugins in a
/// folder of its own (`PACKER_PLUGIN_PATH`): Debian's Packer 1.6.6 is older than
/// packer/node.pkr.hcl's `required_version`, and plan, validate and build refuse it
/// (exit 4). The stand-in's `fmt` is Debian's `packer fmt`. Tests that run Debian's Packer
/// itself (builds against moto, cancellation) use [`sib_debian_packer`].
pub fn sib() -> Command {
    let standin = StandinPacker::shared();
    let mut cmd = sib_debian_packer();
    cmd.env("SIB_PACKER", &standin.program)
        .env("PACKER_PLUGIN_PATH", standin.dir.join("plugins"));
    cmd
}

/// The binary under test with Debian's Packer (`packer` on PATH), for templates without
/// `required_version` (the test fixtures) and for its refusal of packer/.
pub fn sib_debian_packer() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_slurm-image-builder"));
    cmd.current_dir(repo())
        .env("CHECKPOINT_DISABLE", "1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env_remove("AWS_PROFILE")
        .env_remove("SIB_PACKER")
        .env_remove("PACKER_PLUGIN_PATH")
        .stdin(Stdio::null());
    cmd
}

/// A stand-in `packer` (a bash script), new enough for packer/'s `required_version`, that
/// behaves as Packer does where the builder depends on it:
///
/// - `version` prints `Packer v<version>`;
/// - `init <template>` installs each `github.com/...` plugin the template's
///   `required_plugins` name into `PACKER_PLUGIN_PATH` (else `~/.config/packer/plugins`),
///   laid out as Packer lays them out, printing "Installed plugin ..." for each new one; or,
///   after [`StandinPacker::init_fails`], prints that text on stderr and exits 1;
/// - `fmt` is Debian's `packer fmt`;
/// - `validate` and `build` fail with Packer's "Missing plugins" error while a required
///   plugin is not installed there; `validate` keeps its variables file as `calls.vars`
///   and notes in `calls` an upload folder (`agent_dir`, `sources_dir`) that is not
///   absolute or does not exist; `build` prints the machine-readable lines of one AMI in
///   the variables file's region.
///
/// Each call is one line of `<dir>/calls`: the arguments, then `PACKER_PLUGIN_PATH=<value>`
/// (`<unset>` when not set).
pub struct StandinPacker {
    /// Its folder (`packer`, `calls`, `init-fails`; `plugins/` for the shared one).
    pub dir: PathBuf,
    /// The program.
    pub program: PathBuf,
}

impl StandinPacker {
    /// A stand-in reporting `version`, in `dir`.
    pub fn new(dir: &Path, version: &str) -> StandinPacker {
        let program = dir.join("packer");
        let real = debian_packer();
        let script = STANDIN
            .replace("@DIR@", &dir.display().to_string())
            .replace("@VERSION@", version)
            .replace("@REAL@", &real.display().to_string());
        // Written aside and renamed: test processes may make the shared one at once.
        let tmp = dir.join(format!(".packer.{}", std::process::id()));
        std::fs::write(&tmp, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &program).unwrap();
        StandinPacker {
            dir: dir.to_path_buf(),
            program,
        }
    }

    /// The one [`sib`] uses (v1.11.2), below the crate's target temporary folder.
    pub fn shared() -> StandinPacker {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("standin-packer");
        std::fs::create_dir_all(dir.join("plugins")).unwrap();
        StandinPacker::new(&dir, "1.11.2")
    }

    /// From now on `init` fails: prints `stderr` there and exits 1.
    pub fn init_fails(&self, stderr: &str) {
        std::fs::write(self.dir.join("init-fails"), stderr).unwrap();
    }

    /// The calls so far, one per line.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Debian's `packer` on PATH (not a stand-in).
pub fn debian_packer() -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("packer"))
        .find(|p| p.is_file() && !std::fs::read(p).unwrap_or_default().starts_with(b"#!"))
        .expect("Debian's packer on PATH (apt-get install packer)")
}

const STANDIN: &str = r#"#!/bin/bash
# Stand-in Packer of imagebuilder/tests/common (StandinPacker).
dir='@DIR@'
echo "$* PACKER_PLUGIN_PATH=${PACKER_PLUGIN_PATH-<unset>}" >>"$dir/calls"
plugins=${PACKER_PLUGIN_PATH:-$HOME/.config/packer/plugins}
template=${!#}
required() {
	local files=("$template")
	[ -d "$template" ] && files=("$template"/*.pkr.hcl)
	sed -n 's|^ *source *= *"\(github\.com/[^"]*\)".*|\1|p' "${files[@]}"
}
missing() {
	local src
	for src in $(required); do
		compgen -G "$plugins/$src/packer-plugin-${src##*/}_v*" >/dev/null || echo "$src"
	done
}
refuse_missing() {
	local m
	m=$(missing)
	[ -z "$m" ] && return
	printf 'Error: Missing plugins

The following plugins are required, but not installed:

%s

Did you run packer init for this project ?
' "$m" >&2
	exit 1
}
case $1 in
version) echo "Packer v@VERSION@" ;;
init)
	if [ -e "$dir/init-fails" ]; then
		cat "$dir/init-fails" >&2
		exit 1
	fi
	for src in $(required); do
		f="$plugins/$src/packer-plugin-${src##*/}_v1.8.2_x5.0_linux_amd64"
		[ -e "$f" ] && continue
		mkdir -p "${f%/*}"
		printf '#!/bin/sh
' >"$f"
		echo "Installed plugin $src v1.8.2 in "$f""
	done
	;;
fmt)
	shift
	exec '@REAL@' fmt "$@"
	;;
validate)
	refuse_missing
	vf=${2#-var-file=}
	cp "$vf" "$dir/calls.vars"
	for name in agent_dir sources_dir; do
		path=$(sed -n "s/^$name = \"\(.*\)\"\$/\1/p" "$vf")
		case $path in /*) ;; *) echo "$name not absolute: $path" >>"$dir/calls" ;; esac
		[ -d "$path" ] || echo "$name missing: $path" >>"$dir/calls"
	done
	;;
build)
	refuse_missing
	vf=${3#-var-file=}
	region=$(sed -n 's/^region = "\(.*\)"$/\1/p' "$vf")
	echo "1795982894,amazon-ebs.node,artifact,0,id,$region:ami-0123456789abcdef0"
	echo "1795982894,,ui,say,Build 'amazon-ebs.node' finished."
	;;
esac
"#;

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
