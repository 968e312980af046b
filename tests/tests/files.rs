//! End to end: files the agent writes as root, in folders a less trusted user can write,
//! are never written through a symlink that user planted, and temporaries left by a killed
//! run are gone after the next.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;

use slurm_e2e::agent::{munge_ids, report, NodeEnv};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn read_proc_number(path: &str) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Runs a command as the munge user (`setpriv`), so that what it creates is the munge
/// user's, as an attacker's would be.
fn as_munge(args: &[&str]) {
    let (uid, gid) = munge_ids().unwrap();
    let st = std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args(args)
        .status()
        .unwrap();
    assert!(st.success(), "setpriv {args:?}");
}

#[test]
fn a_symlink_planted_at_the_keys_temporary_name_is_not_followed() {
    let env = NodeEnv::start("").unwrap();
    let key_path = env.key_path();
    let munge_dir = key_path.parent().unwrap().to_path_buf();
    // A root-owned file the munge user must not be able to change.
    let victim = env.root.path().join("victim");
    std::fs::write(&victim, "root's own file\n").unwrap();

    let (uid, gid) = munge_ids().unwrap();
    let max = read_proc_number("/proc/sys/kernel/pid_max");
    // The key itself is a symlink to the victim, planted by the munge user, who owns the
    // key's folder (as on Debian: /etc/munge, munge:munge 0700).
    as_munge(&[
        "ln",
        "-s",
        victim.to_str().unwrap(),
        key_path.to_str().unwrap(),
    ]);
    // Temporaries left by killed writers: pid 0 is never a writer (today's scheme), pid_max
    // is never handed out (the old fixed name).
    let stale = munge_dir.join(".munge.key.0.AAAAAAAAAAAA.sna-tmp");
    as_munge(&["touch", stale.to_str().unwrap()]);
    let stale_legacy = munge_dir.join(format!(".munge.key.tmp.{max}"));
    as_munge(&["touch", stale_legacy.to_str().unwrap()]);
    // Symlinks to the victim at the temporary names the agent used to use,
    // `.munge.key.tmp.<pid>`, for the next pids the kernel will hand out (planted from this
    // process, so that planting takes no pids, and given to the munge user).
    let next = read_proc_number("/proc/sys/kernel/ns_last_pid") + 1;
    for pid in next..(next + 4000).min(max) {
        let link = munge_dir.join(format!(".munge.key.tmp.{pid}"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(uid), Some(gid)).unwrap();
    }

    let out = env.bootstrap(&[]).unwrap();
    assert!(out.status.success(), "bootstrap failed:\n{}", stderr(&out));
    assert_eq!(report(&out).unwrap()["key_changed"], true);

    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "root's own file\n",
        "the key was written through a planted symlink"
    );
    let meta = std::fs::symlink_metadata(&key_path).unwrap();
    assert!(
        meta.file_type().is_file(),
        "munge.key is not a regular file"
    );
    assert_eq!(meta.mode() & 0o7777, 0o400);
    assert_eq!(meta.uid(), munge_ids().unwrap().0);
    assert_eq!(
        std::fs::read(&key_path).unwrap(),
        slurm_e2e::Munge::shared().unwrap().key().unwrap()
    );
    // The stale temporaries are gone (pid_max itself is never handed out).
    assert!(
        std::fs::symlink_metadata(&stale).is_err(),
        "stale temporary kept"
    );
    assert!(
        std::fs::symlink_metadata(&stale_legacy).is_err(),
        "stale legacy temporary kept"
    );
}

#[test]
fn a_key_in_an_unencrypted_parameter_is_refused_unless_allowed() {
    use base64::Engine;
    let env = NodeEnv::start("").unwrap();
    let key = slurm_e2e::Munge::shared().unwrap().key().unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    env.moto
        .put_parameter("/plain/key", &b64, "String")
        .unwrap();
    let out = env
        .bootstrap(&["--auth-key-source", "ssm:/plain/key"])
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(
        err.contains("SSM parameter /plain/key: the parameter is not a SecureString"),
        "{err}"
    );
    assert!(!env.key_path().exists());
    assert!(!err.contains(&b64[..16]), "key material in the output");

    let out = env
        .bootstrap(&[
            "--auth-key-source",
            "ssm:/plain/key",
            "--set",
            "auth.allow_string_parameter=true",
        ])
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("is not a SecureString"), "no warning: {err}");
    assert_eq!(std::fs::read(env.key_path()).unwrap(), key);
}

#[test]
fn a_key_value_secret_needs_its_field_named() {
    use base64::Engine;
    let env = NodeEnv::start("").unwrap();
    let key = slurm_e2e::Munge::shared().unwrap().key().unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    env.moto
        .create_secret_string("cluster/kv", &format!("{{\"munge_key\":\"{b64}\"}}"))
        .unwrap();
    let out = env
        .bootstrap(&["--auth-key-source", "secretsmanager:cluster/kv"])
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(65), "{err}");
    assert!(
        err.contains(
            "Secrets Manager secret cluster/kv: the value is a JSON object (a key/value secret), \
             not a key: name the field that holds the key"
        ),
        "{err}"
    );
    assert!(!err.contains("key_encoding"), "{err}");
    assert!(!err.contains(&b64[..16]), "key material in the output");
    assert!(!env.key_path().exists());

    let out = env
        .bootstrap(&["--auth-key-source", "secretsmanager:cluster/kv#munge_key"])
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(env.key_path()).unwrap(), key);
}

#[test]
fn two_bootstraps_at_once_take_turns_and_converge() {
    use rustix::fs::{flock, FlockOperation};
    let env = NodeEnv::start("").unwrap();
    // Hold the bootstrap lock, as a running bootstrap would, so that both wait for it.
    std::fs::create_dir_all(env.state_dir()).unwrap();
    let lock = std::fs::File::create(env.state_dir().join("bootstrap.lock")).unwrap();
    flock(&lock, FlockOperation::LockExclusive).unwrap();
    let spawn = |name: &str| {
        let err = std::fs::File::create(env.root.path().join(name)).unwrap();
        let child = env
            .agent_command(&["bootstrap", "--output", "json"])
            .unwrap()
            .stdout(std::process::Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap();
        (child, env.root.path().join(name))
    };
    let (a, a_err) = spawn("a.err");
    let (b, b_err) = spawn("b.err");
    for path in [&a_err, &b_err] {
        slurm_e2e::wait_until(
            "the bootstrap to say it waits for the lock",
            std::time::Duration::from_secs(60),
            std::time::Duration::from_millis(50),
            || {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                Ok(text
                    .contains("another bootstrap is running: waiting")
                    .then_some(()))
            },
        )
        .unwrap();
    }
    assert!(
        !env.options_file().exists(),
        "a bootstrap went past the lock"
    );
    drop(lock);
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let text = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
    assert!(a.status.success(), "first:\n{}", text(&a_err));
    assert!(b.status.success(), "second:\n{}", text(&b_err));
    // One installed the key; the other found it in place.
    let changed: Vec<bool> = [&a, &b]
        .iter()
        .map(|o| report(o).unwrap()["key_changed"].as_bool().unwrap())
        .collect();
    assert_eq!(changed.iter().filter(|c| **c).count(), 1, "{changed:?}");
    let options = std::fs::read_to_string(env.options_file()).unwrap();
    assert_eq!(options.matches("SLURMD_OPTIONS=").count(), 1, "{options}");
    assert!(env.slurmd_pid().unwrap() > 0);
}
