//! An emulator of the two EC2 calls that tell an instance when its Capacity Block ends,
//! which moto does not implement: `DescribeInstances` (the instance's
//! `capacityReservationId` and `instanceLifecycle`) and `DescribeCapacityReservations`
//! (`endDate`, `reservationType`, `state`).
//!
//! [`Ec2Emulator::start`] binds a TCP port on 127.0.0.1 and answers like EC2's regional
//! endpoint (EC2 query protocol, API version `2016-11-15`; AWS EC2 API Reference,
//! `API_DescribeInstances`, `API_DescribeCapacityReservations`, `API_CapacityReservation`,
//! and "Error codes for the Amazon EC2 API"):
//!
//! - `POST /` with a form-encoded body (`Action=...&Version=2016-11-15&...`); an action
//!   other than the two: `InvalidAction` (400).
//! - A SigV4 `Authorization` header (credential scope `<date>/<region>/ec2/aws4_request`)
//!   verified with the secret key of the instance the access key belongs to, and its session
//!   token in `X-Amz-Security-Token`. No header: `MissingAuthenticationToken` (401); an
//!   unknown access key or a wrong token: `AuthFailure` (401); a wrong signature:
//!   `SignatureDoesNotMatch` (403).
//! - An action denied to the instance's role ([`Ec2Emulator::deny`]): `UnauthorizedOperation`
//!   (403), the message naming `assumed-role/<role>/<instance id>` and `ec2:<Action>`, as
//!   EC2's does.
//! - `DescribeInstances` with `InstanceId.N`: one reservation per instance with
//!   `instanceId`, `instanceType`, `instanceState` (`16`, `running`), `placement`, and when
//!   the instance runs in a capacity reservation `capacityReservationId` and
//!   `capacityReservationSpecification`, and `instanceLifecycle` when set (`capacity-block`,
//!   `spot`). An unknown id: `InvalidInstanceID.NotFound` (400). Filters are not served.
//! - `DescribeCapacityReservations` with `CapacityReservationId.N` (none: every
//!   reservation): `capacityReservationSet` items with `capacityReservationId`,
//!   `instanceType`, `availabilityZone`, `totalInstanceCount`, `state`, `startDate`,
//!   `endDate` (absent for an unlimited one), `endDateType` (`limited`/`unlimited`),
//!   `reservationType` (`default` or `capacity-block`) and `capacityBlockId`. An unknown id:
//!   `InvalidCapacityReservationId.NotFound` (400).
//!
//! Errors are EC2's XML: `<Response><Errors><Error><Code>..</Code><Message>..</Message>
//! </Error></Errors><RequestID>..</RequestID></Response>`. Every request is kept as an
//! [`Ec2Request`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};

use crate::aws::{
    expected_signature, form_pairs, header, parse_authorization, request_id, xml_escape as escape,
    xml_response as xml, Resp, Server,
};

/// EC2's content type.
const XML: &str = "text/xml;charset=UTF-8";

/// The API version of EC2's query protocol, and its XML namespace.
pub const API_VERSION: &str = "2016-11-15";

/// The account of the emulated resources (in ARNs and messages).
pub const ACCOUNT_ID: &str = "111122223333";

/// An instance the emulator knows, with the credentials of its instance profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ec2Instance {
    /// EC2 instance id.
    pub instance_id: String,
    /// Instance type, e.g. `p5.48xlarge`.
    pub instance_type: String,
    /// Availability Zone, e.g. `us-east-1a`.
    pub availability_zone: String,
    /// `instanceLifecycle`: `capacity-block`, `spot`; `None` for on-demand (EC2 leaves the
    /// element out).
    pub instance_lifecycle: Option<String>,
    /// The capacity reservation it runs in (`cr-...`), if any.
    pub capacity_reservation_id: Option<String>,
    /// IAM role of its instance profile.
    pub role: String,
    /// Access key id of its role session.
    pub access_key_id: String,
    /// Secret access key (checks the SigV4 signature).
    pub secret_access_key: String,
    /// Session token; when set, `X-Amz-Security-Token` must carry it.
    pub session_token: Option<String>,
}

/// A capacity reservation (`CapacityReservation` in the API reference).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityReservation {
    /// `cr-...`.
    pub id: String,
    /// Instance type it reserves.
    pub instance_type: String,
    /// Availability Zone.
    pub availability_zone: String,
    /// Instances it reserves.
    pub total_instance_count: u32,
    /// `active`, `expired`, `cancelled`, `pending`, `failed`, `scheduled`,
    /// `payment-pending`, `payment-failed`.
    pub state: String,
    /// Start, Unix seconds.
    pub start_date: i64,
    /// End, Unix seconds; `None`: no end date (`endDateType` `unlimited`).
    pub end_date: Option<i64>,
    /// `default` (an On-Demand Capacity Reservation) or `capacity-block`.
    pub reservation_type: String,
}

/// One request as the emulator saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ec2Request {
    /// `Action`.
    pub action: Option<String>,
    /// The access key id of the signature, if one was read.
    pub access_key_id: Option<String>,
    /// The instance the access key belongs to.
    pub instance_id: Option<String>,
    /// HTTP status answered.
    pub status: u16,
    /// Error code answered, if any.
    pub error: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    /// Access key id to instance.
    by_key: HashMap<String, Ec2Instance>,
    reservations: BTreeMap<String, CapacityReservation>,
    /// (instance id, action) pairs its role may not call.
    denied: HashSet<(String, String)>,
    log: Vec<Ec2Request>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running EC2 emulator; dropping it stops the server.
#[derive(Debug)]
pub struct Ec2Emulator {
    server: Server,
    shared: Shared,
}

impl Ec2Emulator {
    /// Binds a free port on 127.0.0.1 and starts serving (no instances yet).
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start() -> io::Result<Ec2Emulator> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// Like [`Ec2Emulator::start`], bound to `addr` (port 0: a free one), e.g. an address
    /// of a network namespace the caller runs in.
    ///
    /// # Errors
    /// When the socket, runtime or thread cannot be created.
    pub fn start_on(addr: SocketAddr) -> io::Result<Ec2Emulator> {
        let shared: Shared = Arc::default();
        let server_shared = shared.clone();
        let server = Server::start(addr, "ec2-emulator", move |req| {
            handle(server_shared.clone(), req)
        })?;
        Ok(Ec2Emulator { server, shared })
    }

    /// The endpoint URL, e.g. `http://127.0.0.1:40123` (`AWS_ENDPOINT_URL_EC2`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// Adds (or replaces) an instance.
    pub fn add_instance(&self, instance: Ec2Instance) {
        lock(&self.shared)
            .by_key
            .insert(instance.access_key_id.clone(), instance);
    }

    /// Adds or replaces a capacity reservation.
    pub fn put_capacity_reservation(&self, reservation: CapacityReservation) {
        lock(&self.shared)
            .reservations
            .insert(reservation.id.clone(), reservation);
    }

    /// Moves the end of reservation `id` (a Capacity Block extended: EC2 sets the new
    /// `endDate`). Returns whether the reservation exists.
    pub fn set_end_date(&self, id: &str, end_date: Option<i64>) -> bool {
        match lock(&self.shared).reservations.get_mut(id) {
            Some(r) => {
                r.end_date = end_date;
                true
            }
            None => false,
        }
    }

    /// Denies (or allows again) `action` (e.g. `DescribeCapacityReservations`) to the role
    /// of instance `instance_id`.
    pub fn deny(&self, instance_id: &str, action: &str, denied: bool) {
        let key = (instance_id.to_string(), action.to_string());
        let mut st = lock(&self.shared);
        if denied {
            st.denied.insert(key);
        } else {
            st.denied.remove(&key);
        }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Ec2Request> {
        lock(&self.shared).log.clone()
    }
}

async fn handle(shared: Shared, req: Request<Incoming>) -> Result<Resp, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let mut record = Ec2Request {
        action: None,
        access_key_id: None,
        instance_id: None,
        status: 0,
        error: None,
    };
    let resp = match answer(&shared, &parts, &body, &mut record) {
        Ok(body_xml) => xml(StatusCode::OK, XML, body_xml),
        Err(e) => {
            record.error = Some(e.code.to_string());
            e.response()
        }
    };
    record.status = resp.status().as_u16();
    lock(&shared).log.push(record);
    Ok(resp)
}

/// An error EC2 answers.
struct Ec2Error {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Ec2Error {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Ec2Error {
        Ec2Error {
            status,
            code,
            message: message.into(),
        }
    }

    fn response(&self) -> Resp {
        xml(
            self.status,
            XML,
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
                self.code,
                escape(&self.message),
                request_id()
            ),
        )
    }
}

/// The values of a list parameter `<name>.1`, `<name>.2`, ... in the order of their index.
fn list(params: &[(String, String)], name: &str) -> Vec<String> {
    let mut items: Vec<(u32, String)> = params
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix(name)?.strip_prefix('.')?.parse().ok()?;
            Some((n, v.clone()))
        })
        .collect();
    items.sort();
    items.into_iter().map(|(_, v)| v).collect()
}

/// ISO 8601 as EC2 writes it: `2026-12-07T12:00:00.000Z`.
fn iso(secs: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{}.000Z", s.trim_end_matches('Z'))
}

fn answer(
    shared: &Shared,
    parts: &hyper::http::request::Parts,
    body: &[u8],
    record: &mut Ec2Request,
) -> Result<String, Ec2Error> {
    let params = form_pairs(body);
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    record.action = param("Action").map(str::to_string);
    if parts.method != Method::POST || parts.uri.path() != "/" {
        return Err(Ec2Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidAction",
            "This emulator serves POST / only.",
        ));
    }
    let Some(auth) = header(&parts.headers, "authorization").and_then(parse_authorization) else {
        return Err(Ec2Error::new(
            StatusCode::UNAUTHORIZED,
            "MissingAuthenticationToken",
            "The request must contain either a valid (registered) AWS access key ID or X.509 certificate.",
        ));
    };
    record.access_key_id = Some(auth.access_key_id.to_string());
    let instance = lock(shared).by_key.get(auth.access_key_id).cloned();
    let auth_failure = || {
        Ec2Error::new(
            StatusCode::UNAUTHORIZED,
            "AuthFailure",
            "AWS was not able to validate the provided access credentials",
        )
    };
    let Some(caller) = instance else {
        return Err(auth_failure());
    };
    record.instance_id = Some(caller.instance_id.clone());
    if caller.session_token.as_deref() != header(&parts.headers, "x-amz-security-token") {
        return Err(auth_failure());
    }
    match expected_signature(parts, body, &auth, &caller.secret_access_key) {
        Some(sig) if sig == auth.signature && auth.service == "ec2" => {}
        _ => {
            return Err(Ec2Error::new(
                StatusCode::FORBIDDEN,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method.",
            ))
        }
    }
    let action = param("Action").unwrap_or_default().to_string();
    if !matches!(
        action.as_str(),
        "DescribeInstances" | "DescribeCapacityReservations"
    ) {
        return Err(Ec2Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidAction",
            format!("The action {action} is not valid for this web service."),
        ));
    }
    let st = lock(shared);
    if st
        .denied
        .contains(&(caller.instance_id.clone(), action.clone()))
    {
        return Err(Ec2Error::new(
            StatusCode::FORBIDDEN,
            "UnauthorizedOperation",
            format!(
                "You are not authorized to perform this operation. User: arn:aws:sts::{ACCOUNT_ID}:assumed-role/{}/{} is not authorized to perform: ec2:{action} because no identity-based policy allows the ec2:{action} action",
                caller.role, caller.instance_id
            ),
        ));
    }
    let head = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<{action}Response xmlns=\"http://ec2.amazonaws.com/doc/{API_VERSION}/\">\n    <requestId>{}</requestId>\n",
        request_id()
    );
    let tail = format!("</{action}Response>");
    if action == "DescribeInstances" {
        let mut items = String::new();
        for id in list(&params, "InstanceId") {
            let Some(i) = st.by_key.values().find(|i| i.instance_id == id) else {
                return Err(Ec2Error::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidInstanceID.NotFound",
                    format!("The instance ID '{id}' does not exist"),
                ));
            };
            items.push_str(&instance_xml(i));
        }
        Ok(format!(
            "{head}    <reservationSet>\n{items}    </reservationSet>\n{tail}"
        ))
    } else {
        let ids = list(&params, "CapacityReservationId");
        let mut items = String::new();
        if ids.is_empty() {
            for r in st.reservations.values() {
                items.push_str(&reservation_xml(r));
            }
        }
        for id in ids {
            let Some(r) = st.reservations.get(&id) else {
                return Err(Ec2Error::new(
                    StatusCode::BAD_REQUEST,
                    "InvalidCapacityReservationId.NotFound",
                    format!("The capacity reservation ID '{id}' does not exist"),
                ));
            };
            items.push_str(&reservation_xml(r));
        }
        Ok(format!(
            "{head}    <capacityReservationSet>\n{items}    </capacityReservationSet>\n{tail}"
        ))
    }
}

fn instance_xml(i: &Ec2Instance) -> String {
    let lifecycle = i
        .instance_lifecycle
        .as_ref()
        .map(|l| {
            format!(
                "                <instanceLifecycle>{}</instanceLifecycle>\n",
                escape(l)
            )
        })
        .unwrap_or_default();
    let cr = i
        .capacity_reservation_id
        .as_ref()
        .map(|c| {
            let c = escape(c);
            format!(
                "                <capacityReservationId>{c}</capacityReservationId>\n                <capacityReservationSpecification>\n                    <capacityReservationTarget>\n                        <capacityReservationId>{c}</capacityReservationId>\n                    </capacityReservationTarget>\n                </capacityReservationSpecification>\n"
            )
        })
        .unwrap_or_else(|| {
            "                <capacityReservationSpecification>\n                    <capacityReservationPreference>open</capacityReservationPreference>\n                </capacityReservationSpecification>\n".to_string()
        });
    let reservation = format!("r-{:017x}", rand::random::<u64>() >> 4);
    format!(
        "        <item>\n            <reservationId>{reservation}</reservationId>\n            <ownerId>{ACCOUNT_ID}</ownerId>\n            <groupSet/>\n            <instancesSet>\n                <item>\n                <instanceId>{}</instanceId>\n                <instanceState>\n                    <code>16</code>\n                    <name>running</name>\n                </instanceState>\n                <instanceType>{}</instanceType>\n                <placement>\n                    <availabilityZone>{}</availabilityZone>\n                    <tenancy>default</tenancy>\n                </placement>\n{lifecycle}{cr}                </item>\n            </instancesSet>\n        </item>\n",
        escape(&i.instance_id),
        escape(&i.instance_type),
        escape(&i.availability_zone),
    )
}

fn reservation_xml(r: &CapacityReservation) -> String {
    let (end, end_type) = match r.end_date {
        Some(e) => (
            format!("            <endDate>{}</endDate>\n", iso(e)),
            "limited",
        ),
        None => (String::new(), "unlimited"),
    };
    let block = if r.reservation_type == "capacity-block" {
        format!(
            "            <capacityBlockId>cb-{}</capacityBlockId>\n",
            r.id.trim_start_matches("cr-")
        )
    } else {
        String::new()
    };
    let id = escape(&r.id);
    format!(
        "        <item>\n            <capacityReservationId>{id}</capacityReservationId>\n            <ownerId>{ACCOUNT_ID}</ownerId>\n            <capacityReservationArn>arn:aws:ec2:us-east-1:{ACCOUNT_ID}:capacity-reservation/{id}</capacityReservationArn>\n            <instanceType>{}</instanceType>\n            <instancePlatform>Linux/UNIX</instancePlatform>\n            <availabilityZone>{}</availabilityZone>\n            <tenancy>default</tenancy>\n            <totalInstanceCount>{}</totalInstanceCount>\n            <availableInstanceCount>0</availableInstanceCount>\n            <ebsOptimized>true</ebsOptimized>\n            <ephemeralStorage>false</ephemeralStorage>\n            <state>{}</state>\n            <startDate>{}</startDate>\n{end}            <endDateType>{end_type}</endDateType>\n            <instanceMatchCriteria>targeted</instanceMatchCriteria>\n            <createDate>{}</createDate>\n            <tagSet/>\n            <reservationType>{}</reservationType>\n{block}        </item>\n",
        escape(&r.instance_type),
        escape(&r.availability_zone),
        r.total_instance_count,
        escape(&r.state),
        iso(r.start_date),
        iso(r.start_date),
        escape(&r.reservation_type),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn form_bodies_decode() {
        let p = form_pairs(b"Action=DescribeInstances&InstanceId.2=i-2&InstanceId.1=i-1&X=a+b%2Fc");
        assert_eq!(list(&p, "InstanceId"), vec!["i-1", "i-2"]);
        assert_eq!(p[3], ("X".to_string(), "a b/c".to_string()));
    }

    #[test]
    fn dates_are_written_as_ec2_writes_them() {
        assert_eq!(iso(1_765_108_800), "2025-12-07T12:00:00.000Z");
    }
}
