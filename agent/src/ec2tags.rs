//! The instance's tags through EC2's `DescribeTags` API, for `imds.tags = "describe-tags"`:
//! the tag source when tags in instance metadata are off. EC2 refuses to turn
//! `InstanceMetadataTags` on while any tag key holds `/` or a space (metadata paths cannot
//! carry them; kubernetes/cloud-provider-aws#762), and such keys are legal EC2 tag keys, so
//! an instance may have tags that metadata can never serve.
//!
//! The request: `DescribeTags` with the filters `resource-id` = the instance id and
//! `resource-type` = `instance`, every page (`NextToken`), in the instance's region, with
//! the SDK's default credentials chain (the instance profile, which needs
//! `ec2:DescribeTags`; `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` point it elsewhere) and
//! the SDK's standard retries (throttling included).
//!
//! API: <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeTags.html>.
//!
//! Floor 2 (outside systems): uses [`crate::imds`]'s error chain and [`crate::exit`].

use std::collections::BTreeMap;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;

use crate::exit::Exit;

/// Page size asked of `DescribeTags` (its maximum is 1000; an instance has at most 50 tags,
/// so one page in practice, but every page is read).
const PAGE_SIZE: i32 = 1000;

/// `DescribeTags` failed for the instance: no credentials, access denied
/// (`UnauthorizedOperation`: the instance profile lacks `ec2:DescribeTags`), throttled past
/// the SDK's retries, or EC2 unreachable.
#[derive(Debug, thiserror::Error)]
#[error(
    "imds.tags = \"describe-tags\": EC2 DescribeTags of instance {instance_id} in {region} \
     failed{}: {message}",
    code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default()
)]
pub struct DescribeTagsError {
    /// The instance whose tags were asked for.
    pub instance_id: String,
    /// The region asked.
    pub region: String,
    /// EC2's error code when it answered one (`UnauthorizedOperation`,
    /// `RequestLimitExceeded`, ...).
    pub code: Option<String>,
    /// What happened: EC2's message, or the transport or credentials error chain.
    pub message: String,
}

impl DescribeTagsError {
    /// Whether EC2 denied the call (the instance profile lacks `ec2:DescribeTags`, or the
    /// credentials are refused).
    pub fn is_access_denied(&self) -> bool {
        crate::retry::is_access_denied(self.code.as_deref())
            || matches!(
                self.code.as_deref(),
                Some("AuthFailure" | "UnrecognizedClientException")
            )
    }

    /// The exit code: 77 (EX_NOPERM) when access is denied, as for the key; otherwise 69
    /// (EX_UNAVAILABLE), as for the other AWS APIs.
    pub fn exit(&self) -> Exit {
        if self.is_access_denied() {
            Exit::NoPerm
        } else {
            Exit::Unavailable
        }
    }
}

/// The tags of instance `instance_id` in `region` (key to value; every page), through the
/// SDK's default configuration there.
///
/// An instance without tags gives an empty map: that is "none", not "unavailable".
///
/// # Errors
/// [`DescribeTagsError`] naming the setting, the API, the instance and EC2's error code.
pub async fn instance_tags(
    region: &str,
    instance_id: &str,
) -> Result<BTreeMap<String, String>, DescribeTagsError> {
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .load()
        .await;
    describe(&aws_sdk_ec2::Client::new(&sdk), region, instance_id).await
}

/// [`instance_tags`] with a client already made.
///
/// # Errors
/// [`DescribeTagsError`].
pub async fn describe(
    ec2: &aws_sdk_ec2::Client,
    region: &str,
    instance_id: &str,
) -> Result<BTreeMap<String, String>, DescribeTagsError> {
    let filter = |name: &str, value: &str| Filter::builder().name(name).values(value).build();
    let mut pages = ec2
        .describe_tags()
        .filters(filter("resource-id", instance_id))
        .filters(filter("resource-type", "instance"))
        .into_paginator()
        .page_size(PAGE_SIZE)
        .send();
    let mut tags = BTreeMap::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(|e| DescribeTagsError {
            instance_id: instance_id.to_string(),
            region: region.to_string(),
            code: e.code().map(str::to_string),
            message: e
                .message()
                .map(str::to_string)
                .unwrap_or_else(|| crate::imds::error_chain(&e)),
        })?;
        for t in page.tags() {
            // Filtered to this instance; a description without a key is nothing to keep.
            if let Some(k) = t.key() {
                tags.insert(k.to_string(), t.value().unwrap_or_default().to_string());
            }
        }
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_denied_is_exit_77_and_the_rest_69() {
        let e = |code: Option<&str>| DescribeTagsError {
            instance_id: "i-0123456789abcdef0".into(),
            region: "us-east-1".into(),
            code: code.map(str::to_string),
            message: "m".into(),
        };
        assert_eq!(e(Some("UnauthorizedOperation")).exit(), Exit::NoPerm);
        assert_eq!(e(Some("RequestLimitExceeded")).exit(), Exit::Unavailable);
        assert_eq!(e(None).exit(), Exit::Unavailable);
        let text = e(Some("UnauthorizedOperation")).to_string();
        assert!(
            text.starts_with(
                "imds.tags = \"describe-tags\": EC2 DescribeTags of instance \
                 i-0123456789abcdef0 in us-east-1 failed (UnauthorizedOperation): m"
            ),
            "{text}"
        );
    }
}
