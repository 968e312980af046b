//! Publishing an AMI id to the SSM parameter that nodes (and launch templates) watch.
//!
//! Each publish is a new version of the parameter (SSM keeps 100 versions), so history is
//! `GetParameterHistory`; labels (e.g. a release name) mark versions for rollback. The
//! parameter's data type is `aws:ec2:image` by default, which lets launch templates use
//! `resolve:ssm:<name>`; AWS validates such values asynchronously, so the id's form is
//! checked here first (moto does not validate it at all).
//!
//! A fleet whose launch templates name an image id directly does not follow the parameter:
//! its replacements boot the old image, and the nodes' rolling upgrade would drain them for
//! nothing. `publish --launch-template NAME` therefore also rolls the named templates
//! ([`roll_launch_templates`]): a new version from the default one with only `ImageId`
//! changed (EC2 CreateLaunchTemplateVersion with `SourceVersion`), made the default
//! (ModifyLaunchTemplate). A template whose default version already takes its image from
//! `resolve:ssm:<the parameter>` follows the parameter and is left as it is.

use crate::error::{Error, Result};
use aws_sdk_ssm::types::ParameterType;
use serde::Serialize;

/// What to publish.
#[derive(Debug, Clone)]
pub struct PublishRequest {
    /// Parameter name, e.g. `/slurm/compute/ami`.
    pub parameter: String,
    /// The AMI id.
    pub ami_id: String,
    /// Labels to attach to the new version.
    pub labels: Vec<String>,
    /// `aws:ec2:image` or `text`.
    pub data_type: String,
    /// Parameter description.
    pub description: Option<String>,
}

/// A previous version of the parameter.
#[derive(Debug, Clone, Serialize)]
pub struct PreviousVersion {
    /// Version number.
    pub version: i64,
    /// Its value.
    pub value: String,
    /// Its labels.
    pub labels: Vec<String>,
}

/// What was published.
#[derive(Debug, Clone, Serialize)]
pub struct PublishResult {
    /// Parameter name.
    pub parameter: String,
    /// The new version.
    pub version: i64,
    /// The value written.
    pub ami_id: String,
    /// Labels attached to the new version.
    pub labels: Vec<String>,
    /// Earlier versions, newest first.
    pub history: Vec<PreviousVersion>,
    /// The launch templates rolled to the image (`--launch-template`).
    #[serde(default)]
    pub launch_templates: Vec<TemplateUpdate>,
}

/// What happened to one launch template.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TemplateUpdate {
    /// Its name.
    pub name: String,
    /// Its id (`lt-...`).
    pub id: String,
    /// The default version before.
    pub previous_default: i64,
    /// The image of that version (an AMI id, or `resolve:ssm:...`).
    pub previous_image: String,
    /// The default version after (the new one, or `previous_default` when unchanged).
    pub default_version: i64,
    /// `updated` (new default version with the image), `unchanged` (it already launched
    /// the image) or `follows-parameter` (`resolve:ssm:<the parameter>`).
    pub outcome: String,
}

fn ec2_message<E, R>(e: &aws_sdk_ec2::error::SdkError<E, R>) -> String
where
    E: std::error::Error + aws_sdk_ec2::error::ProvideErrorMetadata + 'static,
    R: std::fmt::Debug,
{
    match e.as_service_error() {
        Some(se) => format!(
            "{}: {}",
            se.code().unwrap_or("error"),
            se.message().unwrap_or_default()
        ),
        None => aws_sdk_ec2::error::DisplayErrorContext(e).to_string(),
    }
}

/// Makes each launch template in `names` launch `ami_id`: a new version from its default
/// version with only `ImageId` replaced, then made the default. Re-running converges (a
/// template whose default version already launches the image is `unchanged`); a template
/// that resolves its image from `resolve:ssm:<parameter>` is `follows-parameter`.
///
/// # Errors
/// [`Error::LaunchTemplate`] naming the template and EC2's error code and message (the
/// templates before it stay updated).
pub async fn roll_launch_templates(
    ec2: &aws_sdk_ec2::Client,
    names: &[String],
    ami_id: &str,
    parameter: &str,
) -> Result<Vec<TemplateUpdate>> {
    let mut out = Vec::new();
    for name in names {
        let fail = |what: &str, message: String| Error::LaunchTemplate {
            template: name.clone(),
            message: format!("{what}: {message}"),
        };
        let current = ec2
            .describe_launch_template_versions()
            .launch_template_name(name)
            .versions("$Default")
            .send()
            .await
            .map_err(|e| fail("DescribeLaunchTemplateVersions", ec2_message(&e)))?;
        let Some(v) = current.launch_template_versions().first() else {
            return Err(fail(
                "DescribeLaunchTemplateVersions",
                "no default version".into(),
            ));
        };
        let previous_default = v.version_number().unwrap_or_default();
        let id = v.launch_template_id().unwrap_or_default().to_string();
        let previous_image = v
            .launch_template_data()
            .and_then(|d| d.image_id())
            .unwrap_or_default()
            .to_string();
        let mut update = TemplateUpdate {
            name: name.clone(),
            id,
            previous_default,
            previous_image: previous_image.clone(),
            default_version: previous_default,
            outcome: String::new(),
        };
        if previous_image == ami_id {
            update.outcome = "unchanged".into();
            out.push(update);
            continue;
        }
        if previous_image
            .strip_prefix("resolve:ssm:")
            .is_some_and(|p| {
                p == parameter || p.split_once(':').is_some_and(|(n, _)| n == parameter)
            })
        {
            update.outcome = "follows-parameter".into();
            out.push(update);
            continue;
        }
        let data = aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
            .image_id(ami_id)
            .build();
        let created = ec2
            .create_launch_template_version()
            .launch_template_name(name)
            .source_version(previous_default.to_string())
            .version_description(format!(
                "slurm-image-builder publish {ami_id} ({parameter})"
            ))
            .launch_template_data(data)
            .send()
            .await
            .map_err(|e| fail("CreateLaunchTemplateVersion", ec2_message(&e)))?;
        let Some(new_version) = created
            .launch_template_version()
            .and_then(|v| v.version_number())
        else {
            return Err(fail(
                "CreateLaunchTemplateVersion",
                "no version number in the answer".into(),
            ));
        };
        ec2.modify_launch_template()
            .launch_template_name(name)
            .default_version(new_version.to_string())
            .send()
            .await
            .map_err(|e| {
                fail(
                    &format!("ModifyLaunchTemplate (version {new_version} created, not default)"),
                    ec2_message(&e),
                )
            })?;
        update.default_version = new_version;
        update.outcome = "updated".into();
        out.push(update);
    }
    Ok(out)
}

/// An EC2 client from the same configuration as [`client`].
pub async fn ec2_client(region: Option<String>, endpoint: Option<String>) -> aws_sdk_ec2::Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    aws_sdk_ec2::Client::new(&loader.load().await)
}

/// Whether `id` looks like an AMI id (`ami-` and 8 or 17 hex digits).
pub fn is_ami_id(id: &str) -> bool {
    id.strip_prefix("ami-").is_some_and(|hexpart| {
        matches!(hexpart.len(), 8 | 17) && hexpart.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Build an SSM client from the usual AWS configuration (environment, profile, IMDS),
/// with an optional region and endpoint override (moto in tests).
pub async fn client(region: Option<String>, endpoint: Option<String>) -> aws_sdk_ssm::Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    aws_sdk_ssm::Client::new(&loader.load().await)
}

fn service_error<E>(parameter: &str, e: aws_sdk_ssm::error::SdkError<E>) -> Error
where
    E: std::error::Error + 'static,
{
    let message = match &e {
        aws_sdk_ssm::error::SdkError::ServiceError(se) => se.err().to_string(),
        other => {
            let mut msg = other.to_string();
            let mut cur = std::error::Error::source(other);
            while let Some(s) = cur {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                cur = s.source();
            }
            msg
        }
    };
    Error::Publish {
        parameter: parameter.to_string(),
        message,
    }
}

/// Write the AMI id as a new version of the parameter, label it, and read back history.
pub async fn publish(client: &aws_sdk_ssm::Client, req: &PublishRequest) -> Result<PublishResult> {
    if !is_ami_id(&req.ami_id) {
        return Err(Error::BadInput(format!(
            "'{}' is not an AMI id (ami- and 8 or 17 hex digits); refusing to publish it to {}",
            req.ami_id, req.parameter
        )));
    }
    if !req.parameter.starts_with('/') && req.parameter.contains('/') {
        return Err(Error::BadInput(format!(
            "parameter name '{}': a hierarchical name must start with '/'",
            req.parameter
        )));
    }
    let mut put = client
        .put_parameter()
        .name(&req.parameter)
        .value(&req.ami_id)
        .r#type(ParameterType::String)
        .data_type(&req.data_type)
        .overwrite(true);
    if let Some(d) = &req.description {
        put = put.description(d);
    }
    let out = put
        .send()
        .await
        .map_err(|e| service_error(&req.parameter, e))?;
    let version = out.version();

    if !req.labels.is_empty() {
        let labelled = client
            .label_parameter_version()
            .name(&req.parameter)
            .parameter_version(version)
            .set_labels(Some(req.labels.clone()))
            .send()
            .await
            .map_err(|e| service_error(&req.parameter, e))?;
        let invalid = labelled.invalid_labels();
        if !invalid.is_empty() {
            return Err(Error::Publish {
                parameter: req.parameter.clone(),
                message: format!(
                    "version {version} written, but these labels were refused: {}",
                    invalid.join(", ")
                ),
            });
        }
    }

    let mut history = Vec::new();
    let mut pages = client
        .get_parameter_history()
        .name(&req.parameter)
        .into_paginator()
        .send();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| service_error(&req.parameter, e))?;
        for p in page.parameters() {
            if p.version() != version {
                history.push(PreviousVersion {
                    version: p.version(),
                    value: p.value().unwrap_or_default().to_string(),
                    labels: p.labels().to_vec(),
                });
            }
        }
    }
    history.sort_by_key(|p| std::cmp::Reverse(p.version));
    Ok(PublishResult {
        parameter: req.parameter.clone(),
        version,
        ami_id: req.ami_id.clone(),
        labels: req.labels.clone(),
        history,
        launch_templates: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn ami_ids() {
        assert!(super::is_ami_id("ami-12345678"));
        assert!(super::is_ami_id("ami-415713dcf730347a2"));
        assert!(!super::is_ami_id("ami-xyz"));
        assert!(!super::is_ami_id("snap-12345678"));
    }
}
