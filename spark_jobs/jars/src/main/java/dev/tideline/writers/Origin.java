package dev.tideline.writers;

/** Where a change came from: its Kafka record. Dead letters name it so a duplicate is recognisable. */
public record Origin(String topic, int partition, long offset) {}
