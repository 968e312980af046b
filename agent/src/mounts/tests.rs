#![allow(clippy::unwrap_used)]
use super::*;

fn lustre(mount_point: &str, source: &str) -> MountSettings {
    MountSettings {
        mount_point: mount_point.into(),
        source: source.into(),
        ..MountSettings::default()
    }
}

fn err_of(m: &MountSettings) -> (&'static str, String) {
    let e = m.resolve("us-east-1").unwrap_err();
    (e.key(), e.to_string())
}

#[test]
fn fsx_source_is_built_from_id_region_and_mount_name() {
    let m = MountSettings {
        mount_point: "/fsx".into(),
        file_system_id: "fs-0123456789abcdef0".into(),
        mount_name: "abcdefgh".into(),
        ..MountSettings::default()
    };
    let s = m.resolve("eu-west-1").unwrap();
    assert_eq!(
        s.what,
        "fs-0123456789abcdef0.fsx.eu-west-1.amazonaws.com@tcp:/abcdefgh"
    );
    assert_eq!(s.fs_type, "lustre");
    assert_eq!(s.unit, "fsx.mount");
    assert_eq!(s.options, ["relatime", "flock", "_netdev"]);
    assert!(s.requires.is_empty());
    // An explicit region wins; China regions use amazonaws.com.cn.
    let cn = MountSettings {
        region: "cn-north-1".into(),
        ..m.clone()
    };
    assert_eq!(
        cn.resolve("eu-west-1").unwrap().what,
        "fs-0123456789abcdef0.fsx.cn-north-1.amazonaws.com.cn@tcp:/abcdefgh"
    );
}

#[test]
fn lnet_becomes_requires_and_after() {
    let m = MountSettings {
        lnet: true,
        ..lustre("/fsx", "fs-1.fsx.us-east-1.amazonaws.com@tcp:/fsx")
    };
    let s = m.resolve("").unwrap();
    assert_eq!(s.requires, ["lnet.service"]);
    assert_eq!(s.options, ["relatime", "flock", "_netdev"]);
    let text = s.unit_text();
    assert!(
        text.contains("Requires=lnet.service\nAfter=lnet.service\n"),
        "{text}"
    );
    assert!(text.contains("Options=relatime,flock,_netdev\n"), "{text}");
    assert!(!text.contains("x-systemd"), "{text}");
}

#[test]
fn multi_nid_sources_and_overrides() {
    let m = MountSettings {
        options: Some("noatime,flock,x-systemd.after=network-online.target".into()),
        extra_options: "x-systemd.mount-timeout=5min".into(),
        ..lustre(
            "/scratch/fs",
            "10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib1:/fs/sub_dir",
        )
    };
    let s = m.resolve("").unwrap();
    assert_eq!(s.options, ["noatime", "flock"]);
    assert_eq!(s.after, ["network-online.target"]);
    assert_eq!(s.mount_timeout.as_deref(), Some("5min"));
    assert_eq!(s.unit, "scratch-fs.mount");
    let text = s.unit_text();
    assert!(text.starts_with(MARKER));
    assert!(text.contains("What=10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib1:/fs/sub_dir\n"));
    assert!(
        text.contains("Where=/scratch/fs\nType=lustre\nOptions=noatime,flock\nTimeoutSec=5min\n")
    );
}

#[test]
fn efs_and_nfs_use_the_same_machinery() {
    let efs = MountSettings {
        fs_type: "efs".into(),
        mount_point: "/home".into(),
        file_system_id: "fs-12345678".into(),
        ..MountSettings::default()
    };
    let s = efs.resolve("us-west-2").unwrap();
    assert_eq!(s.what, "fs-12345678.efs.us-west-2.amazonaws.com:/");
    assert_eq!(s.fs_type, "nfs4");
    assert!(s.options.contains(&"nfsvers=4.1".to_string()));
    let nfs = MountSettings {
        fs_type: "nfs".into(),
        mount_point: "/data".into(),
        source: "nfs.example.internal:/export/data".into(),
        ..MountSettings::default()
    };
    let s = nfs.resolve("").unwrap();
    assert_eq!(
        (s.fs_type.as_str(), s.options.as_slice()),
        ("nfs", &["_netdev".to_string()][..])
    );
}

#[test]
fn percent_is_escaped_for_systemd_specifiers() {
    let m = MountSettings {
        fs_type: "tmpfs".into(),
        mount_point: "/mnt/100%".into(),
        source: "tmpfs".into(),
        ..MountSettings::default()
    };
    let s = m.resolve("").unwrap();
    assert!(s.unit_text().contains("Where=/mnt/100%%\n"));
    assert_eq!(s.unit, "mnt-100\\x25.mount");
}

#[test]
fn bad_mount_points() {
    for (p, needle) in [
        ("fsx", "not an absolute path"),
        ("relative/fsx", "not an absolute path"),
        ("/fsx/../etc", "\"..\" component"),
        ("/fsx/./a", "\".\" component"),
        ("/fsx/", "not normalized"),
        ("//fsx", "not normalized"),
        ("/", "cannot be a mount point"),
        ("/fsx\nWhat=/dev/sda", "newline"),
        ("", "missing"),
    ] {
        let (key, msg) = err_of(&lustre(p, "10.0.0.1@tcp:/fsx"));
        assert_eq!(key, "mount_point", "{p:?}");
        assert!(msg.contains(needle), "{p:?}: {msg}");
    }
}

#[test]
fn bad_lustre_sources() {
    for (src, needle) in [
        ("fs-1.fsx.us-east-1.amazonaws.com:/abc", "no @<network>"),
        ("fs-1.fsx.us-east-1.amazonaws.com@tcp:abc", "no \":/\""),
        ("10.0.0.1@tcp/fsx", "no \":/\""),
        ("10.0.0.1@tcp:/", "not a Lustre file system name"),
        (
            "10.0.0.1@tcp:/waytoolongname",
            "not a Lustre file system name",
        ),
        ("bad host@tcp:/fsx", "not a host name"),
        ("10.0.0.1@TCP!:/fsx", "not an LNet network name"),
        ("10.0.0.1@tcp:/fsx/a b", "holds ' '"),
        ("", "missing"),
    ] {
        let (key, msg) = err_of(&lustre("/fsx", src));
        assert_eq!(key, "source", "{src:?}");
        assert!(msg.contains(needle), "{src:?}: {msg}");
    }
    let nfs = MountSettings {
        fs_type: "nfs".into(),
        ..lustre("/data", "server:export")
    };
    let (key, msg) = err_of(&nfs);
    assert_eq!(key, "source");
    assert!(msg.contains("does not start with \"/\""), "{msg}");
}

#[test]
fn options_cannot_smuggle_lines_or_fields() {
    for (opts, needle) in [
        ("relatime\nWhat=/dev/sda", "newline"),
        ("relatime 0 0\n/dev/sda /boot", "newline"),
        ("relatime 0 0", "whitespace"),
        ("relatime\t0", "whitespace"),
        ("flock,,relatime", "empty option"),
        ("flock,", "empty option"),
        ("uid=%u", "'%'"),
        ("a#b", "'#'"),
        ("x-systemd.automount", "not supported"),
        ("x-systemd.requires=/dev/sda", "invalid systemd unit name"),
        ("x-systemd.mount-timeout=soon", "not a duration"),
    ] {
        let m = MountSettings {
            options: Some(opts.into()),
            ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
        };
        let (key, msg) = err_of(&m);
        assert_eq!(key, "options", "{opts:?}");
        assert!(msg.contains(needle), "{opts:?}: {msg}");
    }
    let m = MountSettings {
        extra_options: "ro 0 0".into(),
        ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
    };
    assert_eq!(err_of(&m).0, "extra_options");
}

#[test]
fn extra_options_cannot_add_unit_dependencies() {
    for extra in [
        "x-systemd.requires=debug-shell.service",
        "noatime,x-systemd.after=evil.service",
        "x-systemd.before=slurmd.service",
    ] {
        let m = MountSettings {
            extra_options: extra.into(),
            ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
        };
        let (key, msg) = err_of(&m);
        assert_eq!(key, "extra_options", "{extra}");
        assert!(msg.contains("unit dependencies"), "{extra}: {msg}");
    }
}

#[test]
fn only_allowed_options_per_type() {
    // What runs programs or reads files as root is not on any list.
    for (ty, source, opt) in [
        ("fuse.sshfs", "root@10.0.0.1:/export", "ssh_command=/tmp/x"),
        ("fuse.sshfs", "root@10.0.0.1:/export", "ProxyCommand=/tmp/x"),
        ("tmpfs", "tmpfs", "context=system_u"),
        ("nfs4", "10.0.0.1:/export", "size=8m"),
        ("lustre", "10.0.0.1@tcp:/fsx", "helper=/tmp/x"),
    ] {
        let m = MountSettings {
            fs_type: ty.into(),
            source: source.into(),
            options: Some(opt.into()),
            ..lustre("/shared", "")
        };
        let (key, msg) = err_of(&m);
        assert_eq!(key, "options", "{ty} {opt}");
        assert!(msg.contains("not among the options allowed"), "{msg}");
    }
    // The fleet's NFS stand-in: sshfs with the options the proving ground uses.
    let m = MountSettings {
        fs_type: "fuse.sshfs".into(),
        source: "root@10.0.0.1:/export".into(),
        options: Some(
            "_netdev,reconnect,IdentityFile=/etc/slurm-node-agent/id_ed25519,\
             StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,allow_other"
                .into(),
        ),
        extra_options: "x-systemd.mount-timeout=30".into(),
        ..lustre("/mnt/shared", "")
    };
    let s = m.resolve("us-east-1").unwrap();
    assert_eq!(s.fs_type, "fuse.sshfs");
    assert!(s.options.contains(&"allow_other".to_string()));
    let m = MountSettings {
        fs_type: "tmpfs".into(),
        source: "tmpfs".into(),
        options: Some("size=8m,mode=1777,nosuid,nodev".into()),
        ..lustre("/tmp/scratch", "")
    };
    m.resolve("us-east-1").unwrap();
}

#[test]
fn system_folders_are_not_mount_points() {
    for mp in [
        "/etc",
        "/etc/munge",
        "/usr",
        "/usr/local/bin",
        "/proc",
        "/var",
        "/var/lib/slurm-node-agent",
        "/run/munge",
        "/root",
        "/boot",
    ] {
        let m = MountSettings {
            fs_type: "tmpfs".into(),
            source: "tmpfs".into(),
            ..lustre(mp, "")
        };
        let (key, msg) = err_of(&m);
        assert_eq!(key, "mount_point", "{mp}");
        assert!(
            msg.contains("belongs to the operating system"),
            "{mp}: {msg}"
        );
    }
    for mp in [
        "/etcetera",
        "/usrdata",
        "/fsx",
        "/home",
        "/opt/slurm",
        "/mnt/shared",
    ] {
        let m = MountSettings {
            fs_type: "tmpfs".into(),
            source: "tmpfs".into(),
            ..lustre(mp, "")
        };
        m.resolve("us-east-1").unwrap();
    }
}

#[test]
fn bad_ids_and_regions() {
    for (id, region, key) in [
        ("fs-123", "", "file_system_id"),
        ("fs-0123456789ABCDEF0", "", "file_system_id"),
        ("0123456789abcdef0", "", "file_system_id"),
        ("fs-0123456789abcdef0", "us_east_1", "region"),
        ("fs-0123456789abcdef0", "useast1", "region"),
        ("fs-0123456789abcdef0", "us-east-1;rm", "region"),
    ] {
        let m = MountSettings {
            mount_point: "/fsx".into(),
            file_system_id: id.into(),
            region: region.into(),
            mount_name: "abcdefgh".into(),
            ..MountSettings::default()
        };
        let (k, msg) = err_of(&m);
        assert_eq!(k, key, "{id} {region}: {msg}");
    }
    // No region anywhere.
    let m = MountSettings {
        mount_point: "/fsx".into(),
        file_system_id: "fs-0123456789abcdef0".into(),
        mount_name: "abcdefgh".into(),
        ..MountSettings::default()
    };
    assert_eq!(m.resolve("").unwrap_err().key(), "region");
    // Both a source and an id.
    let both = MountSettings {
        source: "10.0.0.1@tcp:/fsx".into(),
        ..m
    };
    assert_eq!(both.resolve("us-east-1").unwrap_err().key(), "source");
}

#[test]
fn duplicate_mount_points_are_refused_with_both_indexes() {
    let a = lustre("/fsx", "10.0.0.1@tcp:/fsx");
    let b = MountSettings {
        fs_type: "nfs".into(),
        ..lustre("/fsx", "server:/x")
    };
    let InvalidKey { key, message: msg } =
        validate_all(&[a.clone(), lustre("/other", "10.0.0.1@tcp:/o"), b]).unwrap_err();
    assert_eq!(key, "mounts[2].mount_point");
    assert!(msg.contains("mounts[0]"), "{msg}");
    assert!(validate_all(&[a]).is_ok());
    let InvalidKey { key, .. } = validate_all(&[lustre("fsx", "10.0.0.1@tcp:/fsx")]).unwrap_err();
    assert_eq!(key, "mounts[0].mount_point");
}

#[test]
fn conflicting_fstab_line_and_foreign_unit_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let env = MountEnv {
        unit_dir: dir.path().join("units"),
        other_unit_dirs: vec![dir.path().join("lib")],
        fstab: dir.path().join("fstab"),
        runtime_dir: dir.path().join("run"),
        ..MountEnv::system()
    };
    let spec = lustre("/fsx", "10.0.0.1@tcp:/fsx").resolve("").unwrap();
    // fstab line for the same path.
    let fstab = "10.0.0.9@tcp:/other /fsx lustre defaults 0 0\n";
    std::fs::write(&env.fstab, fstab).unwrap();
    let e = install_unit(&spec, &env).unwrap_err();
    assert!(matches!(e, MountError::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("line 1"), "{e}");
    assert!(e.to_string().contains("left alone"), "{e}");
    assert_eq!(std::fs::read_to_string(&env.fstab).unwrap(), fstab);
    assert!(!env.unit_dir.join("fsx.mount").exists());
    std::fs::remove_file(&env.fstab).unwrap();
    // A unit of the same name that is not ours.
    std::fs::create_dir_all(&env.unit_dir).unwrap();
    let foreign = "[Mount]\nWhat=/dev/sdb\nWhere=/fsx\n";
    std::fs::write(env.unit_dir.join("fsx.mount"), foreign).unwrap();
    let e = install_unit(&spec, &env).unwrap_err();
    assert!(e.to_string().contains("is not the agent's"), "{e}");
    assert_eq!(
        std::fs::read_to_string(env.unit_dir.join("fsx.mount")).unwrap(),
        foreign
    );
    std::fs::remove_file(env.unit_dir.join("fsx.mount")).unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    std::fs::write(dir.path().join("lib/fsx.mount"), foreign).unwrap();
    assert!(install_unit(&spec, &env).is_err());
    std::fs::remove_file(dir.path().join("lib/fsx.mount")).unwrap();
    // Ours: written once, then unchanged.
    assert_eq!(install_unit(&spec, &env).unwrap(), UnitWrite::Created);
    assert_eq!(install_unit(&spec, &env).unwrap(), UnitWrite::Unchanged);
    let changed = MountSettings {
        extra_options: "noatime".into(),
        ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
    }
    .resolve("")
    .unwrap();
    assert_eq!(install_unit(&changed, &env).unwrap(), UnitWrite::Replaced);
}

#[test]
fn drain_reasons_name_the_mount_and_fit_slurm() {
    let r = drain_reason(
        "i-0123456789abcdef0",
        "/fsx",
        "mount /fsx: statfs did not answer\nwithin 10s",
    );
    assert_eq!(
        r,
        "slurm-node-agent/mount@i-0123456789abcdef0: /fsx: statfs did not answer within 10s"
    );
    assert!(crate::slurm::node::validate_reason(&r).is_ok());
    let long = drain_reason("unknown", "/fsx", &"x".repeat(400));
    assert_eq!(long.chars().count(), 256);
    assert!(crate::reason::is_agent_reason_for(
        &long,
        DRAIN_REASON_CAUSE
    ));
}

#[test]
fn spec_errors_name_the_key_and_read_as_before() {
    let hint = "expected <dns-name>@tcp:/<mount-name> (FSx), or NIDs like 10.0.0.1@o2ib,10.0.0.2@o2ib:10.0.0.3@o2ib:/fs";
    assert_eq!(
        err_of(&lustre("/fsx", "bad host@tcp:/fsx")),
        (
            "source",
            format!(
                "\"bad host@tcp:/fsx\": \"bad host\" is not a host name or IPv4 address; {hint}"
            )
        )
    );
    let nfs = MountSettings {
        fs_type: "nfs".into(),
        ..lustre("/data", "server:export")
    };
    assert_eq!(
        err_of(&nfs).1,
        "\"server:export\": remote path \"export\" does not start with \"/\""
    );
    let m = MountSettings {
        options: Some("flock,,relatime".into()),
        ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
    };
    assert_eq!(
        err_of(&m).1,
        "\"flock,,relatime\" holds an empty option (\",,\" or a trailing \",\")"
    );
    let m = MountSettings {
        extra_options: "x-systemd.mount-timeout=/dev/sda".into(),
        ..lustre("/fsx", "10.0.0.1@tcp:/fsx")
    };
    assert_eq!(
        err_of(&m),
        (
            "extra_options",
            "option \"x-systemd.mount-timeout=/dev/sda\": not a duration".to_string()
        )
    );
    assert_eq!(
        err_of(&lustre("/etc/x", "10.0.0.1@tcp:/fsx")).1,
        "\"/etc/x\" is at or under /etc, which belongs to the operating system: mount shared \
         file systems elsewhere (/fsx, /home, /scratch, /shared, /opt/..., /mnt/...)"
    );
    let missing = lustre("/fsx", "");
    let e = MountError::Settings {
        index: 0,
        source: missing.resolve("us-east-1").unwrap_err(),
    };
    assert_eq!(
        e.to_string(),
        "mounts[0].source: missing: give source (`<dns-name>@tcp:/<mount-name>`) or \
         file_system_id, region and mount_name"
    );
    let InvalidKey { key, message } = validate_all(&[missing]).unwrap_err();
    assert_eq!(
        format!("{key}: {message}"),
        e.to_string(),
        "settings validation and the mount report say the same"
    );
}
