//! The rollout: planned departures of nodes within one budget, slurmctld the referee.
//!
//! - [`budget`]: how many nodes of a partition may be out of service at once, this node's
//!   renewals of the slot it holds, and the count of the partition's nodes;
//! - [`slot`]: the slots themselves, Slurm reservations only one node can create
//!   (take, renew, release, and release a gone holder's for a replacement under another
//!   NodeName);
//! - [`poll`]: when a node asks for the desired image (spread over the fleet, within SSM's
//!   quota);
//! - [`check`]: the rolling image upgrade, one check of the desired image (the daemon's,
//!   each upgrade poll): the image exists, no replacement loop, a slot, the drain request;
//!   the slot's release once the node is back in service on the desired image;
//! - [`repair`]: a repair's slot (`repair.mode = "on"`): taken before its drain, released
//!   once the node, or its replacement, is back in service.
//!
//! The daemon keeps only its loop: it calls [`check::check`] when [`poll`] says so
//! and [`budget::Budget::keep`] on each drain tick. What the upgrade knows about images,
//! reasons and actions is [`crate::upgrade`]'s; the drain state machine that runs the
//! action is [`crate::drain`]'s. The second kind of planned departure, a repair that reboots
//! or replaces a node, takes slots from the same [`budget::Budget`] ([`repair`]).
//!
//! Floor 7 (services): above `drain`, whose engine it drives, and `upgrade`.

pub mod budget;
pub mod check;
pub mod poll;
pub mod repair;
pub mod slot;

pub use budget::Budget;
