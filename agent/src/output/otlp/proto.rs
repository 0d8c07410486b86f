//! Code generated from `proto/opentelemetry/` (opentelemetry-proto v1.10.0)
//! and `proto/opentelemetry-v1.9/` (v1.9.0, whose `Sample` numbers its
//! fields in another order; every other message is v1.10.0's).

#![allow(clippy::all, clippy::pedantic, clippy::too_many_lines, missing_docs)]

pub mod v1_10 {
    pub mod opentelemetry {
        pub mod proto {
            pub mod common {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/otlp-v1.10/opentelemetry.proto.common.v1.rs"
                    ));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/otlp-v1.10/opentelemetry.proto.resource.v1.rs"
                    ));
                }
            }
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/otlp-v1.10/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/otlp-v1.10/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
        }
    }
}

pub mod v1_9 {
    pub mod opentelemetry {
        pub mod proto {
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/otlp-v1.9/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/otlp-v1.9/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
        }
    }
}

pub use v1_10::opentelemetry::proto::{
    collector::profiles::v1development::{
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
        profiles_service_client::ProfilesServiceClient,
    },
    common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value},
    profiles::v1development::{
        Function, KeyValueAndUnit, Line, Location, Mapping, Profile, ProfilesDictionary,
        ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
    },
    resource::v1::Resource,
};

/// The same request as v1.9.0 numbers `Sample`'s fields (Pyroscope v1.19).
pub mod legacy {
    pub use super::v1_9::opentelemetry::proto::{
        collector::profiles::v1development::{
            ExportProfilesServiceRequest, profiles_service_client::ProfilesServiceClient,
        },
        profiles::v1development::{Profile, ResourceProfiles, Sample, ScopeProfiles},
    };

    /// `request` with its samples numbered as v1.9.0 numbers them; nothing
    /// else differs.
    pub fn from_current(
        request: super::ExportProfilesServiceRequest,
    ) -> ExportProfilesServiceRequest {
        ExportProfilesServiceRequest {
            dictionary: request.dictionary,
            resource_profiles: request
                .resource_profiles
                .into_iter()
                .map(|resource| ResourceProfiles {
                    resource: resource.resource,
                    schema_url: resource.schema_url,
                    scope_profiles: resource
                        .scope_profiles
                        .into_iter()
                        .map(|scope| ScopeProfiles {
                            scope: scope.scope,
                            schema_url: scope.schema_url,
                            profiles: scope.profiles.into_iter().map(profile).collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    fn profile(profile: super::Profile) -> Profile {
        Profile {
            sample_type: profile.sample_type,
            samples: profile
                .samples
                .into_iter()
                .map(|sample| Sample {
                    stack_index: sample.stack_index,
                    values: sample.values,
                    attribute_indices: sample.attribute_indices,
                    link_index: sample.link_index,
                    timestamps_unix_nano: sample.timestamps_unix_nano,
                })
                .collect(),
            time_unix_nano: profile.time_unix_nano,
            duration_nano: profile.duration_nano,
            period_type: profile.period_type,
            period: profile.period,
            profile_id: profile.profile_id,
            dropped_attributes_count: profile.dropped_attributes_count,
            original_payload_format: profile.original_payload_format,
            original_payload: profile.original_payload,
            attribute_indices: profile.attribute_indices,
        }
    }
}
