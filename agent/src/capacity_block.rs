//! The Capacity Block for ML an instance runs in, through EC2's API: its end, from which
//! EC2 reclaims the block's instances (`events.capacity_block`).
//!
//! EC2 starts terminating the instances of a Capacity Block 30 minutes before the block's
//! end time (EC2 User Guide, "Capacity Blocks for ML"). No instance metadata path names
//! the reservation, so the lookup is two API calls, each with the SDK's default
//! credentials chain (the instance profile; `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL`
//! point it elsewhere) and standard retries:
//!
//! 1. `DescribeInstances` with `InstanceId.1` = the instance: its `CapacityReservationId`
//!    (none: the instance is in no capacity reservation). Needs `ec2:DescribeInstances`.
//! 2. `DescribeCapacityReservations` with that id: `ReservationType` (`capacity-block`;
//!    `default` is an On-Demand Capacity Reservation, whose instances outlive it),
//!    `EndDate` (absent when `EndDateType` is `unlimited`), `StartDate`, `State`. Needs
//!    `ec2:DescribeCapacityReservations`.
//!
//! APIs: <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html>,
//! <https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeCapacityReservations.html>.
//!
//! Floor 2 (outside systems): uses [`crate::imds`]'s error chain.

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::CapacityReservationType;

/// The Capacity Block an instance runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityBlock {
    /// The capacity reservation, `cr-...`.
    pub reservation_id: String,
    /// `StartDate`, Unix seconds.
    pub start: Option<i64>,
    /// `EndDate`, Unix seconds; `None`: no end date.
    pub end: Option<i64>,
    /// `State`: `active`, `scheduled`, `expired`...
    pub state: String,
}

/// A lookup failed: no credentials, access denied (`UnauthorizedOperation`: the instance
/// profile lacks the action), throttled past the SDK's retries, or EC2 unreachable.
#[derive(Debug, thiserror::Error)]
#[error(
    "events.capacity_block: EC2 {action} for instance {instance_id} failed{}: {message}",
    code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default()
)]
pub struct CapacityBlockError {
    /// The API call: `DescribeInstances` or `DescribeCapacityReservations`.
    pub action: &'static str,
    /// The instance looked up.
    pub instance_id: String,
    /// EC2's error code when it answered one (`UnauthorizedOperation`,
    /// `RequestLimitExceeded`, ...).
    pub code: Option<String>,
    /// EC2's message, or the transport or credentials error chain.
    pub message: String,
}

impl CapacityBlockError {
    /// Whether EC2 refused the call for want of permission (the instance profile lacks
    /// [`CapacityBlockError::iam_action`]).
    pub fn is_access_denied(&self) -> bool {
        crate::retry::is_access_denied(self.code.as_deref())
    }

    /// The IAM action the call needs: `ec2:DescribeInstances`,
    /// `ec2:DescribeCapacityReservations`.
    pub fn iam_action(&self) -> String {
        format!("ec2:{}", self.action)
    }
}

/// The Capacity Block instance `instance_id` runs in: `None` when it runs in no capacity
/// reservation, or in one that is not a Capacity Block ([`reservation_of`], then
/// [`describe`]).
///
/// # Errors
/// [`CapacityBlockError`] naming the call, the instance and EC2's error code.
pub async fn lookup(
    ec2: &aws_sdk_ec2::Client,
    instance_id: &str,
) -> Result<Option<CapacityBlock>, CapacityBlockError> {
    match reservation_of(ec2, instance_id).await? {
        Some(id) => describe(ec2, instance_id, &id).await,
        None => Ok(None),
    }
}

/// The capacity reservation instance `instance_id` runs in (`DescribeInstances`'s
/// `CapacityReservationId`), `None` for none.
///
/// # Errors
/// [`CapacityBlockError`] for `DescribeInstances`.
pub async fn reservation_of(
    ec2: &aws_sdk_ec2::Client,
    instance_id: &str,
) -> Result<Option<String>, CapacityBlockError> {
    let out = ec2
        .describe_instances()
        .instance_ids(instance_id)
        .send()
        .await
        .map_err(|e| failed("DescribeInstances", instance_id, &e))?;
    Ok(out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(instance_id))
        .and_then(|i| i.capacity_reservation_id())
        .map(str::to_string))
}

/// Capacity reservation `reservation_id` (of instance `instance_id`, for the error) as a
/// [`CapacityBlock`]: `None` when it is not one (`ReservationType` other than
/// `capacity-block`) or EC2 did not list it.
///
/// # Errors
/// [`CapacityBlockError`] for `DescribeCapacityReservations`.
pub async fn describe(
    ec2: &aws_sdk_ec2::Client,
    instance_id: &str,
    reservation_id: &str,
) -> Result<Option<CapacityBlock>, CapacityBlockError> {
    let out = ec2
        .describe_capacity_reservations()
        .capacity_reservation_ids(reservation_id)
        .send()
        .await
        .map_err(|e| failed("DescribeCapacityReservations", instance_id, &e))?;
    let Some(r) = out
        .capacity_reservations()
        .iter()
        .find(|r| r.capacity_reservation_id() == Some(reservation_id))
    else {
        return Ok(None);
    };
    if r.reservation_type() != Some(&CapacityReservationType::CapacityBlock) {
        return Ok(None);
    }
    Ok(Some(CapacityBlock {
        reservation_id: reservation_id.to_string(),
        start: r.start_date().map(aws_smithy_types::DateTime::secs),
        end: r.end_date().map(aws_smithy_types::DateTime::secs),
        state: r
            .state()
            .map(|s| s.as_str().to_string())
            .unwrap_or_default(),
    }))
}

/// The error of call `action` from the SDK's error: EC2's code and message, or the
/// transport or credentials error chain.
fn failed<E, R>(
    action: &'static str,
    instance_id: &str,
    e: &aws_sdk_ec2::error::SdkError<E, R>,
) -> CapacityBlockError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    CapacityBlockError {
        action,
        instance_id: instance_id.to_string(),
        code: e.code().map(str::to_string),
        message: e
            .message()
            .map(str::to_string)
            .unwrap_or_else(|| crate::imds::error_chain(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_call_the_instance_and_the_iam_action() {
        let e = CapacityBlockError {
            action: "DescribeCapacityReservations",
            instance_id: "i-0123456789abcdef0".into(),
            code: Some("UnauthorizedOperation".into()),
            message: "m".into(),
        };
        assert!(e.is_access_denied());
        assert_eq!(e.iam_action(), "ec2:DescribeCapacityReservations");
        assert_eq!(
            e.to_string(),
            "events.capacity_block: EC2 DescribeCapacityReservations for instance \
             i-0123456789abcdef0 failed (UnauthorizedOperation): m"
        );
        let throttled = CapacityBlockError {
            code: Some("RequestLimitExceeded".into()),
            ..e
        };
        assert!(!throttled.is_access_denied());
    }
}
