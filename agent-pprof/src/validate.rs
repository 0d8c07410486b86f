//! The structural rules a Parca server enforces on a pprof profile,
//! checked before a profile leaves firn and by the tests.

use crate::proto::Profile;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    #[error("string_table[0] must be the empty string")]
    FirstStringNotEmpty,
    #[error("{kind} at index {index} has id {found}; ids must be sequential from 1")]
    NonSequentialId {
        kind: &'static str,
        index: usize,
        found: u64,
    },
    #[error("sample {index} has {values} values for {types} sample types")]
    ValueCount {
        index: usize,
        values: usize,
        types: usize,
    },
    #[error("sample {index} has no locations")]
    EmptyStack { index: usize },
    #[error("sample {index} refers to location {id}, which does not exist")]
    UnknownLocation { index: usize, id: u64 },
    #[error("location {id} refers to mapping {mapping}, which does not exist")]
    UnknownMapping { id: u64, mapping: u64 },
    #[error("location {id} refers to function {function}, which does not exist")]
    UnknownFunction { id: u64, function: u64 },
    #[error("{field} refers to string {index}, beyond the string table")]
    StringOutOfRange { field: &'static str, index: i64 },
    #[error("mapping {id} has an empty range {start:#x}..{limit:#x}")]
    EmptyMapping { id: u64, start: u64, limit: u64 },
    #[error("location {id} at {address:#x} lies outside its mapping {mapping}")]
    AddressOutsideMapping { id: u64, address: u64, mapping: u64 },
}

/// The first rule `profile` breaks: an empty first string, sequential ids,
/// references within their tables, non-empty mappings that hold their
/// locations, one value per sample type, no empty stack.
pub fn validate(profile: &Profile) -> Result<(), ProfileError> {
    if profile.string_table.first().is_none_or(|s| !s.is_empty()) {
        return Err(ProfileError::FirstStringNotEmpty);
    }
    let strings = Strings(profile.string_table.len());
    check_ids(profile)?;
    for value_type in profile.sample_type.iter().chain(&profile.period_type) {
        strings.check("value type", value_type.r#type)?;
        strings.check("value type unit", value_type.unit)?;
    }
    check_mappings(profile, strings)?;
    for function in &profile.function {
        strings.check("function name", function.name)?;
        strings.check("function system name", function.system_name)?;
        strings.check("function filename", function.filename)?;
    }
    check_locations(profile)?;
    check_samples(profile, strings)
}

/// The length of the string table, to check indexes into it.
#[derive(Clone, Copy)]
struct Strings(usize);

impl Strings {
    fn check(self, field: &'static str, index: i64) -> Result<(), ProfileError> {
        if usize::try_from(index).is_ok_and(|i| i < self.0) {
            Ok(())
        } else {
            Err(ProfileError::StringOutOfRange { field, index })
        }
    }
}

/// Mappings, locations and functions are numbered 1, 2, 3… in table order.
fn check_ids(profile: &Profile) -> Result<(), ProfileError> {
    let sequential = |kind: &'static str, ids: &mut dyn Iterator<Item = u64>| {
        ids.enumerate().try_for_each(|(index, found)| {
            if found == index as u64 + 1 {
                Ok(())
            } else {
                Err(ProfileError::NonSequentialId { kind, index, found })
            }
        })
    };
    sequential("mapping", &mut profile.mapping.iter().map(|m| m.id))?;
    sequential("location", &mut profile.location.iter().map(|l| l.id))?;
    sequential("function", &mut profile.function.iter().map(|f| f.id))
}

fn check_mappings(profile: &Profile, strings: Strings) -> Result<(), ProfileError> {
    for mapping in &profile.mapping {
        strings.check("mapping filename", mapping.filename)?;
        strings.check("mapping build id", mapping.build_id)?;
        if mapping.memory_start >= mapping.memory_limit {
            return Err(ProfileError::EmptyMapping {
                id: mapping.id,
                start: mapping.memory_start,
                limit: mapping.memory_limit,
            });
        }
    }
    Ok(())
}

fn check_locations(profile: &Profile) -> Result<(), ProfileError> {
    for location in &profile.location {
        if location.mapping_id != 0 {
            let mapping = profile
                .mapping
                .get(location.mapping_id as usize - 1)
                .ok_or(ProfileError::UnknownMapping {
                    id: location.id,
                    mapping: location.mapping_id,
                })?;
            if !(mapping.memory_start..mapping.memory_limit).contains(&location.address) {
                return Err(ProfileError::AddressOutsideMapping {
                    id: location.id,
                    address: location.address,
                    mapping: mapping.id,
                });
            }
        }
        for line in &location.line {
            if line.function_id == 0 || line.function_id as usize > profile.function.len() {
                return Err(ProfileError::UnknownFunction {
                    id: location.id,
                    function: line.function_id,
                });
            }
        }
    }
    Ok(())
}

fn check_samples(profile: &Profile, strings: Strings) -> Result<(), ProfileError> {
    for (index, sample) in profile.sample.iter().enumerate() {
        if sample.value.len() != profile.sample_type.len() {
            return Err(ProfileError::ValueCount {
                index,
                values: sample.value.len(),
                types: profile.sample_type.len(),
            });
        }
        if sample.location_id.is_empty() {
            return Err(ProfileError::EmptyStack { index });
        }
        if let Some(&id) = sample
            .location_id
            .iter()
            .find(|&&id| id == 0 || id as usize > profile.location.len())
        {
            return Err(ProfileError::UnknownLocation { index, id });
        }
        for label in &sample.label {
            strings.check("label key", label.key)?;
            strings.check("label value", label.str)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;

    fn valid() -> Profile {
        Profile {
            string_table: vec![String::new(), "samples".into(), "count".into(), "f".into()],
            sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
            mapping: vec![proto::Mapping {
                id: 1,
                memory_start: 0x1000,
                memory_limit: 0x2000,
                ..Default::default()
            }],
            function: vec![proto::Function {
                id: 1,
                name: 3,
                ..Default::default()
            }],
            location: vec![proto::Location {
                id: 1,
                mapping_id: 1,
                address: 0x1800,
                line: vec![proto::Line {
                    function_id: 1,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            sample: vec![proto::Sample {
                location_id: vec![1],
                value: vec![1],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn every_rule_is_enforced() {
        assert_eq!(validate(&valid()), Ok(()));
        type Breaker = fn(&mut Profile);
        let broken: [(Breaker, &str); 8] = [
            (|p| p.string_table[0] = "x".into(), "first string"),
            (|p| p.location[0].id = 2, "location id"),
            (|p| p.sample[0].value.push(2), "value count"),
            (|p| p.sample[0].location_id.clear(), "empty stack"),
            (|p| p.sample[0].location_id = vec![0], "zero location"),
            (|p| p.location[0].address = 0x3000, "address outside"),
            (
                |p| p.location[0].line[0].function_id = 9,
                "unknown function",
            ),
            (|p| p.function[0].name = 99, "string range"),
        ];
        for (breaker, what) in broken {
            let mut profile = valid();
            breaker(&mut profile);
            assert!(validate(&profile).is_err(), "{what} must be rejected");
        }
    }
}
