//! `imds.tags = "describe-tags"`: with tags in instance metadata off (the IMDS emulator
//! serves no `tags/instance`), the instance's tags come from EC2's `DescribeTags` (moto's
//! server), keys with `/` and spaces included, and set settings and fill `{tag:...}`
//! placeholders as metadata tags do; a tag cannot choose the tag source; a refused or
//! unreachable `DescribeTags` is an error naming the setting, the API and the instance.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use imds_emulator::{Config, Emulator};
use slurm_e2e::moto::{Moto, REGION};

/// A key EC2 accepts and instance metadata cannot serve (`/` and a space).
const ODD_KEY: &str = "team/cost center";

/// One instance in moto with tags, and the IMDS emulator speaking for it with tags off.
struct Instance {
    moto: Moto,
    emu: Emulator,
    id: String,
    dir: tempfile::TempDir,
}

impl Instance {
    fn start(tags: &[(&str, &str)]) -> Instance {
        let moto = Moto::start().unwrap();
        let image = moto.register_image("describe-tags").unwrap();
        let id = moto.run_instance(&image).unwrap();
        if !tags.is_empty() {
            moto.create_tags(&id, tags).unwrap();
        }
        let emu = Emulator::start(Config::default()).unwrap();
        emu.clear_tags();
        emu.set("instance-id", id.as_str());
        emu.set("placement/region", REGION);
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        Instance { moto, emu, id, dir }
    }

    /// Writes the image's settings file: the emulator and `imds` in `[imds]`, a state
    /// folder of the test's, and `extra`.
    fn settings(&self, imds: &str, extra: &str) {
        std::fs::write(
            self.dir.path().join("agent.toml"),
            format!(
                "[imds]\nendpoint = \"{}\"\nattempts = 1\n{imds}[agent]\nstate_dir = \"{}\"\n{extra}",
                self.emu.endpoint(),
                self.dir.path().join("state").display()
            ),
        )
        .unwrap();
    }

    /// `slurm-node-agent <args> --config ... --config-dir ...`, with moto's environment
    /// (`AWS_ENDPOINT_URL`, test credentials) and `env` over it.
    fn agent(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_slurm-node-agent"))
            .args(args)
            .arg("--config")
            .arg(self.dir.path().join("agent.toml"))
            .arg("--config-dir")
            .arg(self.dir.path().join("conf.d"))
            .env_clear()
            .envs(self.moto.env())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap()
    }

    fn config_show(&self) -> serde_json::Value {
        let out = self.agent(&["config", "show", "--output", "json"], &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

#[test]
fn tags_come_from_describe_tags_when_metadata_serves_none() {
    let inst = Instance::start(&[
        ("Name", "web-1"),
        (ODD_KEY, "ml7"),
        ("slurm-node-agent:node.features", "from-describe-tags"),
    ]);
    let template = format!("[node]\nname_template = \"n-{{tag:{ODD_KEY}}}-{{tag:Name}}\"\n");
    inst.settings("tags = \"describe-tags\"\n", &template);

    let v = inst.config_show();
    assert_eq!(v["imds.tags"]["value"], "describe-tags");
    assert_eq!(v["node.features"]["value"][0], "from-describe-tags");
    assert_eq!(
        v["node.features"]["source"],
        "instance tag \"slurm-node-agent:node.features\""
    );

    // The NodeName template reads the tags too, the one with '/' and a space included.
    let out = inst.agent(&["status", "--no-slurm", "--output", "json"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["node"], "n-ml7-web-1", "{report}");
    assert_eq!(report["instance_id"], inst.id.as_str());

    // With the default source the same instance's tags are unavailable, and say so.
    inst.settings("", &template);
    let out = inst.agent(&["status", "--no-slurm", "--output", "json"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("serves no tags"), "{err}");
    assert!(err.contains("imds.tags = \"describe-tags\""), "{err}");
}

/// User data may choose the source (it is read before the tags); a tag may not.
#[test]
fn user_data_may_choose_the_tag_source_and_a_tag_may_not() {
    let inst = Instance::start(&[
        ("slurm-node-agent:imds.tags", "metadata"),
        ("slurm-node-agent:node.weight", "17"),
    ]);
    inst.settings("", "");
    inst.emu.set_user_data(
        "Content-Type: multipart/mixed; boundary=\"XX\"\nMIME-Version: 1.0\n\n--XX\n\
         Content-Type: application/x-slurm-node-agent\n\n[imds]\ntags = \"describe-tags\"\n--XX--\n",
    );
    let out = inst.agent(&["config", "show", "--output", "json"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["imds.tags"]["value"], "describe-tags");
    assert_eq!(
        v["imds.tags"]["source"],
        "user data part 1 (application/x-slurm-node-agent)"
    );
    assert_eq!(v["imds.tags"]["trust"], "user-data");
    // The tags were read (node.weight), and the one naming the source was refused.
    assert_eq!(v["node.weight"]["value"], 17);
    assert!(err.contains("slurm-node-agent:imds.tags"), "{err}");
}

/// An instance without tags has none (not "unavailable"); an unreachable EC2 is an error
/// naming the setting, the API and the instance, exit 69.
#[test]
fn no_tags_is_none_and_an_unreachable_ec2_is_named() {
    let inst = Instance::start(&[]);
    inst.settings("tags = \"describe-tags\"\n", "");
    let v = inst.config_show();
    assert_eq!(v["imds.tags"]["value"], "describe-tags");

    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let out = inst.agent(
        &["config", "show"],
        &[("AWS_ENDPOINT_URL_EC2", format!("http://127.0.0.1:{closed}"))],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&format!(
            "imds.tags = \"describe-tags\": EC2 DescribeTags of instance {} in {REGION} failed",
            inst.id
        )),
        "{err}"
    );
}
