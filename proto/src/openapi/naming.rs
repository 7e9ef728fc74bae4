//! `PascalCase` (the OpenAPI's parameter and field names) versus `snake_case` (this contract's
//! field names), including the acronyms the API spells in capitals (`NFSVolume`, `VSwitchId`,
//! `ContainerID`, `TTY`).

use serde_json::{Map, Value};

/// `VSwitchId` → `v_switch_id`, `NFSVolume` → `nfs_volume`, `ContainerID` → `container_id`.
pub fn to_snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut snake = String::with_capacity(name.len() + 4);
    for (index, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            let previous = chars[index - 1];
            let next_is_lower = chars.get(index + 1).is_some_and(char::is_ascii_lowercase);
            let boundary = previous.is_ascii_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_ascii_uppercase() && next_is_lower);
            if boundary && !snake.ends_with('_') {
                snake.push('_');
            }
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

/// `v_switch_id` → `VSwitchId`, `container_group_ids` → `ContainerGroupIds`.
pub fn to_pascal(name: &str) -> String {
    name.split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// Renames every object key of `value` with `rename`, dropping `null` members (the API sends
/// them for absent values; this contract has defaults instead).
pub fn rename_keys(value: Value, rename: &impl Fn(&str) -> String) -> Value {
    match value {
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (rename(&k), rename_keys(v, rename)))
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .filter(|v| !v.is_null())
                .map(|v| rename_keys(v, rename))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_convert_both_ways() {
        let cases = [
            ("VSwitchId", "v_switch_id"),
            ("NFSVolume", "nfs_volume"),
            ("ContainerID", "container_id"),
            ("TTY", "tty"),
            ("IntranetIp", "intranet_ip"),
            ("ContainerGroupIds", "container_group_ids"),
            ("lastTransitionTime", "last_transition_time"),
            ("Ip", "ip"),
        ];
        for (pascal, snake) in cases {
            assert_eq!(to_snake(pascal), snake, "{pascal}");
        }
        for snake in [
            "v_switch_id",
            "container_group_ids",
            "intranet_ip",
            "web_socket_uri",
        ] {
            assert_eq!(to_snake(&to_pascal(snake)), snake);
        }
        assert_eq!(to_pascal("v_switch_id"), "VSwitchId");
    }

    #[test]
    fn keys_are_renamed_deeply_and_nulls_dropped() {
        let value = serde_json::json!({"ContainerGroups": [{"ContainerGroupId": "eci-1", "InternetIp": null, "Tags": [{"Key": "k"}]}]});
        let renamed = rename_keys(value, &to_snake);
        assert_eq!(
            renamed,
            serde_json::json!({"container_groups": [{"container_group_id": "eci-1", "tags": [{"key": "k"}]}]})
        );
    }
}
